"""Every step lands in a bucket that warm-up compiles, and the bucket
holds the step."""

from hypothesis import given, settings
from hypothesis import strategies as st

from jaxinfer.worker.buckets import Buckets


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4096), st.integers(1, 512), st.integers(1, 256),
       st.booleans(), st.booleans(), st.data())
def test_every_step_lands_in_a_listed_bucket(max_tokens, max_seqs, max_pages,
                                             fixed, small, data):
    max_seqs = min(max_seqs, max_tokens)
    b = Buckets.make(max_tokens, max_seqs, max_pages, fixed_pages=fixed,
                     small_decode=small)
    shapes = set(b.all_shapes())
    assert len(shapes) == len(b.all_shapes())  # no program listed twice
    n_seqs = data.draw(st.integers(1, max_seqs))
    decode_only = data.draw(st.booleans())
    n_tok = n_seqs if decode_only else data.draw(
        st.integers(min(n_seqs + 1, max_tokens), max_tokens))
    if n_tok == n_seqs:
        decode_only = True
    pages = data.draw(st.integers(1, max_pages))
    T, S, P = b.pick(n_tok, n_seqs, pages, decode_only)
    assert (T, S, P, decode_only, 0) in shapes
    assert T >= n_tok and S >= n_seqs and P >= pages and S <= T
    # A speculative engine's buckets (verifying steps among them) too.
    width = data.draw(st.integers(2, 9))
    v = Buckets.make(max_tokens, max_seqs, max_pages, fixed_pages=fixed,
                     small_decode=small, verify_width=width)
    n_tok = data.draw(st.integers(n_seqs, min(max_tokens, n_seqs * width)))
    longest = data.draw(st.integers(-(-n_tok // n_seqs), n_tok - n_seqs + 1))
    got = v.bucket(n_tok, n_seqs, pages, longest=longest)
    assert got in set(v.all_shapes()) and len(set(v.all_shapes())) == len(
        v.all_shapes())
    assert (got.tokens >= n_tok and got.seqs >= n_seqs and got.pages >= pages
            and got.seqs <= got.tokens)
    # A verifying bucket's attention serves rows of at most max_q_len.
    assert got.max_q_len in (0, width) and longest <= (got.max_q_len or n_tok)


def test_fixed_pages_make_one_width_and_few_programs():
    ladder = Buckets.make(2048, 256, 128)
    fixed = Buckets.make(2048, 256, 128, fixed_pages=True)
    assert fixed.pages == (128,)
    assert len(ladder.pages) > 1
    # llama3-8b on one GPU: 7 decode-only + 8 prefill shapes.
    assert len(fixed.all_shapes()) == 15


def test_small_decode_runs_one_stream_alone():
    """CPU buckets: a lone decode row is a one-row program (a one-row dot is
    XLA CPU's fast matrix-vector path); GPU buckets keep the 16-token floor."""
    cpu = Buckets.make(256, 8, 16, small_decode=True)
    gpu = Buckets.make(256, 8, 16)
    assert cpu.pick(1, 1, 2, True) == (1, 1, 4)
    assert cpu.pick(3, 3, 2, True) == (4, 4, 4)
    assert gpu.pick(1, 1, 2, True) == (16, 4, 4)
    assert cpu.pick(6, 1, 1, False) == gpu.pick(6, 1, 1, False) == (16, 8, 4)


def test_a_one_token_prompt_chunk_makes_a_prefill_bucket():
    """Rows of one token each are decode-only only when every row samples:
    a row inside its prompt (which may score prompt logprobs) takes a
    prefill bucket, so decode buckets need no prompt-logprob variant."""
    b = Buckets.make(256, 16, 8)
    assert b.bucket(4, 4, 2).decode_only
    mixed = b.bucket(4, 4, 2, all_sample=False)
    assert not mixed.decode_only
    assert mixed in b.all_shapes()


def test_a_verifying_step_samples_its_own_rows_not_max_num_seqs():
    """Speculative decoding with k = 4: 64 rows of 5 tokens land in T = 320,
    S = 64 (320 sampled rows), not the prefill ladder's T = 512, S = 256
    (1280); a step with a longer chunk keeps the prefill ladder, and one
    whose aligned shape would have more rows in all too."""
    b = Buckets.make(2048, 256, 128, fixed_pages=True, verify_width=5)
    assert b.bucket(320, 64, 10, longest=5) == (320, 64, 128, False, 5)
    # 640 < 1536 rows
    assert b.bucket(200, 50, 10, longest=5) == (320, 64, 128, False, 5)
    assert b.bucket(330, 64, 10) == (512, 256, 128, False, 0)  # a longer chunk
    # As many tokens, but one row brings 9: a prefill bucket.
    assert b.bucket(200, 50, 10, longest=9).seqs == 256
    assert b.bucket(10, 2, 3, longest=5) == (32, 4, 128, False, 5)  # 52 < 96
    small = Buckets.make(2048, 256, 128, verify_width=17)
    # 256 x 17 > the largest T
    assert small.bucket(1000, 250, 3, longest=17).seqs == 256
    assert b.bucket(64, 64, 3) == (64, 64, 128, True, 0)  # no drafts: decode
    assert b.bucket(320, 64, 10, all_sample=False, longest=5).seqs == 256
    shapes = b.all_shapes()
    assert (320, 64, 128, False, 5) in shapes
    assert len(set(shapes)) == len(shapes)
    assert Buckets.make(2048, 256, 128).bucket(320, 64, 10,
                                               longest=5).seqs == 256
