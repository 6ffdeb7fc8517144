"""n > 1: one RequestOutput with n completions; the samples share the
prompt's pages (asserted on the block tables and the pool's free count)."""

from __future__ import annotations

from jaxinfer import RequestOutputKind, SamplingParams

B = 16
PROMPT = [1] + list(range(500, 539))  # 40 tokens: 2 full pages + 8


def test_n4_shares_prompt_pages(tiny_llm):
    engine = tiny_llm.llm_engine
    kv = engine.scheduler.kv
    free0 = kv.pool.num_free
    sp = SamplingParams(n=4, temperature=1.0, seed=11, max_tokens=6,
                        ignore_eos=True)
    rid = engine.add_request("n4", {"prompt_token_ids": PROMPT}, sp)
    assert rid == "n4"
    outs = []
    tables = None
    while engine.has_unfinished_requests():
        outs += engine.step()
        ids = [f"{i}_n4" for i in range(4)]
        if tables is None and all(
                i in kv.block_tables and engine.scheduler.requests[i].output_token_ids
                for i in ids):
            tables = [list(kv.block_tables[i]) for i in ids]
            used = free0 - kv.pool.num_free
    # All four samples hold the prompt's two full pages themselves...
    assert all(t[:2] == tables[0][:2] for t in tables)
    # ...and private copies of the third (first divergent) page.
    assert len({t[2] for t in tables}) == 4
    # Shared: 2 + 4 pages instead of 4 x 3 (prefix-cache pages may add none).
    assert used == 2 + 4
    final = [o for o in outs if o.finished]
    assert len(final) == 1 and final[0].request_id == "n4"
    comps = final[0].outputs
    assert [c.index for c in comps] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 6 and c.finished() for c in comps)
    assert len({tuple(c.token_ids) for c in comps}) == 4  # independent draws


def test_n_through_generate_and_seeds(tiny_llm):
    sp = SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=5,
                        ignore_eos=True, logprobs=2)
    a = tiny_llm.generate([{"prompt_token_ids": PROMPT}], sp, use_tqdm=False)[0]
    b = tiny_llm.generate([{"prompt_token_ids": PROMPT}], sp, use_tqdm=False)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len(a.outputs) == 3 and all(len(c.logprobs) == 5 for c in a.outputs)
    # Sample i of a seeded request draws as a single request seeded seed + i.
    solo = tiny_llm.generate([{"prompt_token_ids": PROMPT}], SamplingParams(
        temperature=0.8, seed=7, max_tokens=5, ignore_eos=True),
        use_tqdm=False)[0]
    assert solo.outputs[0].token_ids == a.outputs[2].token_ids


def test_n_final_only_and_delta(tiny_llm):
    engine = tiny_llm.llm_engine
    for kind in (RequestOutputKind.FINAL_ONLY, RequestOutputKind.DELTA):
        sp = SamplingParams(n=2, temperature=1.0, max_tokens=4, ignore_eos=True,
                            output_kind=kind)
        engine.add_request(f"k{kind.value}", [1, 2, 3, 4], sp)
        outs = []
        while engine.has_unfinished_requests():
            outs += engine.step()
        if kind == RequestOutputKind.FINAL_ONLY:
            assert len(outs) == 1 and len(outs[0].outputs) == 2
        else:
            toks = {0: [], 1: []}
            for o in outs:
                for c in o.outputs:
                    toks[c.index] += c.token_ids
            assert all(len(t) == 4 for t in toks.values())
            assert outs[-1].finished and sum(o.finished for o in outs) == 1


def test_abort_parent_aborts_all_samples(tiny_llm):
    engine = tiny_llm.llm_engine
    engine.add_request("ab", [1, 2, 3], SamplingParams(n=3, max_tokens=50))
    engine.step()
    engine.step()
    engine.abort_request("ab")
    assert not engine.has_unfinished_requests()
