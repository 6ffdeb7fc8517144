"""The models a server answers to: its base model names and its LoRA
adapters (vLLM's ``OpenAIServingModels``).

A request's ``model`` field picks the base model or an adapter by name;
``/v1/models`` lists both (an adapter's card names its folder as ``root``
and the base model as ``parent``). Adapters come from ``--lora-modules``
at start and, when ``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` (or
``JAXINFER_ALLOW_RUNTIME_LORA_UPDATING``) is set, from
``POST /v1/load_lora_adapter`` / ``/v1/unload_lora_adapter``. Each adapter
gets the next ``lora_int_id``; unloading only removes the name (requests
already running finish with it), so asking for it afterwards is a 404.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import os
import re

from ...lora.errors import LoRAAdapterNotFoundError, LoRANotEnabledError
from ...lora.request import LoRARequest
from .errors import APIError, ModelNotFoundError
from .protocol import ModelCard

logger = logging.getLogger(__name__)

# A served adapter's name: it is echoed in answers and logs, so printable
# and short; "org/name:tag"-style names fit.
MAX_LORA_NAME_CHARS = 128
_LORA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+-]*")


def check_lora_name(name: str) -> None:
    """Raises ValueError (a 400, param lora_name) for a name that is too
    long, holds other characters or has an empty or '..' path part."""
    if not isinstance(name, str) or not name:
        raise ValueError("lora_name must be a non-empty string")
    shown = f"{name[:40]!r}{'...' if len(name) > 40 else ''}"
    if len(name) > MAX_LORA_NAME_CHARS:
        raise ValueError(f"lora_name {shown} has {len(name)} characters; at "
                         f"most {MAX_LORA_NAME_CHARS} are accepted")
    if (not _LORA_NAME.fullmatch(name)
            or any(part in ("", ".", "..") for part in name.split("/"))):
        raise ValueError(
            f"lora_name {shown} is not accepted: use letters, digits and "
            "'.', '_', '-', ':', '@', '+', '/' (no empty, '.' or '..' "
            "parts between slashes), starting with a letter or digit")


RUNTIME_UPDATE_VARIABLES = ("VLLM_ALLOW_RUNTIME_LORA_UPDATING",
                            "JAXINFER_ALLOW_RUNTIME_LORA_UPDATING")


def runtime_lora_updating_allowed() -> bool:
    """vLLM's switch for the load/unload routes ("1" or "true")."""
    return any(os.environ.get(v, "0").strip().lower() in ("1", "true")
               for v in RUNTIME_UPDATE_VARIABLES)


@dataclasses.dataclass(frozen=True)
class LoRAModulePath:
    """One ``--lora-modules`` entry."""
    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_modules(values: list[str] | None) -> list[LoRAModulePath]:
    """vLLM's two spellings: ``name=path``, or a JSON object with ``name``,
    ``path`` and optionally ``base_model_name``."""
    out = []
    for value in values or ():
        value = value.strip()
        if value.startswith("{"):
            try:
                spec = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"--lora-modules {value!r} is not valid "
                                 f"JSON: {e}") from None
            unknown = sorted(set(spec) - {"name", "path", "base_model_name"})
            if unknown or not spec.get("name") or not spec.get("path"):
                raise ValueError(
                    f"--lora-modules {value!r}: a JSON entry needs 'name' and "
                    "'path' (and may give 'base_model_name')"
                    + (f"; unknown keys {unknown}" if unknown else ""))
            out.append(LoRAModulePath(spec["name"], spec["path"],
                                      spec.get("base_model_name")))
        else:
            name, sep, path = value.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"--lora-modules {value!r}: give name=path "
                                 "(or a JSON object)")
            out.append(LoRAModulePath(name, path))
    for m in out:
        try:
            check_lora_name(m.name)
        except ValueError as e:
            raise ValueError(f"--lora-modules: {e}") from None
    names = [m.name for m in out]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"--lora-modules names {dups} more than once")
    return out


class ServingModels:
    def __init__(self, engine, served_model_names: list[str]):
        self.engine = engine  # an EngineClient
        self.base_names = list(served_model_names)
        self.root = str(engine.model.args.model)
        self.lora_requests: dict[str, LoRARequest] = {}  # by name, in order
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        engine.watch_loras(self._served)

    def _served(self, requests: list[LoRARequest]) -> None:
        """Another front end of the same engine core loaded or removed an
        adapter: serve exactly the engine's adapters."""
        self.lora_requests = {r.lora_name: r for r in requests}

    async def refresh(self, name: str | None = None) -> None:
        """Asks the engine core for its adapters when ``name`` is not known
        here (None: always), so an adapter another front end just loaded is
        served at once, without waiting for the core's notice."""
        if name is not None and (not name or name in self.base_names
                                 or name in self.lora_requests):
            return
        served = await self.engine.served_loras()
        if served is not None:
            self._served(served)

    def resolve(self, name: str | None) -> tuple[str, LoRARequest | None]:
        """(the name to report, the adapter or None) for a request's
        ``model``; "" or None is the first base name (as vLLM)."""
        if not name or name in self.base_names:
            return name or self.base_names[0], None
        lora = self.lora_requests.get(name)
        if lora is None:
            raise ModelNotFoundError(name, self.base_names + list(self.lora_requests))
        return name, lora

    def cards(self, max_model_len: int) -> list[ModelCard]:
        cards = [ModelCard(id=n, root=self.root, max_model_len=max_model_len)
                 for n in self.base_names]
        cards += [ModelCard(id=lora.lora_name, root=lora.lora_path,
                            parent=lora.base_model_name or self.base_names[0],
                            max_model_len=max_model_len)
                  for lora in self.lora_requests.values()]
        return cards

    def _new_request(self, name: str, path: str,
                     base_model_name: str | None) -> LoRARequest:
        try:
            check_lora_name(name)
        except ValueError as e:
            raise APIError(str(e), param="lora_name") from None
        if name in self.base_names:
            raise APIError(f"{name!r} is the base model's name; give the "
                           "adapter another lora_name", param="lora_name")
        if name in self.lora_requests:
            raise APIError(f"The lora adapter '{name}' has already been "
                           "loaded.", param="lora_name")
        if base_model_name is not None and base_model_name not in self.base_names:
            raise ValueError(f"LoRA module {name!r}: base_model_name "
                             f"{base_model_name!r} is not a served model name "
                             f"({', '.join(self.base_names)})")
        return LoRARequest(name, next(self._ids), path,
                           base_model_name=base_model_name)

    def load_static(self, modules: list[LoRAModulePath],
                    load: bool = True) -> None:
        """``--lora-modules``, at start (a bad adapter stops the server).
        ``load=False``: the engine core read them already, with the ids
        `static_lora_requests` gives."""
        for m in modules:
            request = self._new_request(m.name, m.path, m.base_model_name)
            if load:
                self.engine.engine.add_lora(request)
            self.lora_requests[m.name] = request
            logger.info("LoRA adapter %r loaded from %s", m.name, m.path)

    async def load(self, name: str | None, path: str | None) -> str:
        """``/v1/load_lora_adapter``: reads and checks the adapter before
        its name is served (400 for a bad one, 404 for a missing folder)."""
        if not name or not path:
            raise APIError("Both 'lora_name' and 'lora_path' must be provided.")
        if not self.engine.model.lora_enabled:
            raise APIError(str(LoRANotEnabledError(
                "loading a LoRA adapter needs LoRA: start the server with "
                "--enable-lora")))
        async with self._lock:
            request = self._new_request(name, path, None)
            try:
                request = await self.engine.add_lora(request)
            except LoRAAdapterNotFoundError as e:
                raise APIError(str(e), 404, param="lora_path") from None
            except ValueError as e:
                raise APIError(str(e), param="lora_path") from None
            self.lora_requests[name] = request
        logger.info("LoRA adapter %r loaded from %s", name, path)
        return f"Success: LoRA adapter '{name}' added successfully."

    async def unload(self, name: str | None, lora_int_id: int | None) -> str:
        """``/v1/unload_lora_adapter``: the name is no longer served."""
        if not name and lora_int_id is None:
            raise APIError("either 'lora_name' or 'lora_int_id' needs to be "
                           "provided.")
        async with self._lock:
            found = next((r for r in self.lora_requests.values()
                          if (not name or r.lora_name == name) and
                          (lora_int_id is None or r.lora_int_id == lora_int_id)),
                         None)
            if found is None:
                shown = str(name or lora_int_id)[:MAX_LORA_NAME_CHARS]
                raise APIError(f"The lora adapter '{shown}' cannot be found.",
                               404, param="lora_name")
            del self.lora_requests[found.lora_name]
            await self.engine.remove_lora(found.lora_int_id)
        logger.info("LoRA adapter %r unloaded", found.lora_name)
        return f"Success: LoRA adapter '{found.lora_name}' removed successfully."
