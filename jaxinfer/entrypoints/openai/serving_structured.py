"""A request body's structured-output fields -> one
`StructuredOutputsParams`: OpenAI's ``response_format`` (``json_object``,
``json_schema``), vLLM's ``structured_outputs`` object and its older
``guided_*`` fields. At most one source may constrain a request; a second
is an error naming both."""

from __future__ import annotations

from ...structured.params import StructuredOutputsParams, check_backend
from .errors import APIError

_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


def structured_outputs(req) -> StructuredOutputsParams | None:
    """The request's constraint, or None; raises APIError (400)."""
    sources = []
    rf = req.response_format
    if rf is not None and rf.type != "text":
        sources.append("response_format")
    if req.structured_outputs is not None:
        sources.append("structured_outputs")
    sources += [f for f in _GUIDED if getattr(req, f) is not None]
    if len(sources) > 1:
        raise APIError(f"give one structured-output constraint, not "
                       f"{' and '.join(sources)}", param=sources[1])
    try:
        check_backend("guided_decoding_backend", req.guided_decoding_backend)
    except ValueError as e:
        raise APIError(str(e), param="guided_decoding_backend") from None
    if not sources:
        if req.guided_whitespace_pattern is not None:
            raise APIError("guided_whitespace_pattern applies to guided_json "
                           "or a JSON response_format; give one",
                           param="guided_whitespace_pattern")
        return None
    source = sources[0]
    try:
        if source == "response_format":
            if rf.type == "json_object":
                params = StructuredOutputsParams(json_object=True)
            else:
                schema = rf.json_schema.json_schema
                params = StructuredOutputsParams(
                    json=schema if schema is not None else {})
        elif source == "structured_outputs":
            params = StructuredOutputsParams.from_dict(req.structured_outputs)
        else:
            params = StructuredOutputsParams(
                **{source.removeprefix("guided_"): getattr(req, source)})
        if req.guided_whitespace_pattern is not None:
            params.whitespace_pattern = req.guided_whitespace_pattern
    except ValueError as e:
        raise APIError(str(e), param=source) from None
    return params
