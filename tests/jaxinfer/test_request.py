"""`Request`'s token-level stops when it has no token budget."""

from __future__ import annotations

from jaxinfer.request import Request, RequestStatus
from jaxinfer.sampling_params import SamplingParams

EOS = 2


def _unbounded() -> Request:
    """max_tokens=None and no max_model_len: nothing caps the output."""
    return Request("r", [5, 6], SamplingParams(max_tokens=None), (EOS,))


def test_no_budget_runs_until_a_stop_token():
    req = _unbounded()
    assert req.max_tokens is None
    for token in (7, 8, 9):
        req.append_output_token(token)
        assert not req.check_stop()
    assert req.status == RequestStatus.WAITING
    req.append_output_token(EOS)
    assert req.check_stop()
    assert req.status == RequestStatus.FINISHED_STOPPED


def test_no_budget_is_never_out_of_budget_with_pending():
    req = _unbounded()
    req.num_pending_tokens = 3
    assert not req.out_of_budget_with_pending()


def test_budget_from_max_model_len():
    req = Request("r", [5, 6], SamplingParams(max_tokens=None), (EOS,),
                  max_model_len=4)
    assert req.max_tokens == 2
    req.append_output_token(7)
    assert not req.check_stop()
    req.append_output_token(8)
    assert req.check_stop()
    assert req.status == RequestStatus.FINISHED_LENGTH
