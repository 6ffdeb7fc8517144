"""The CLI side of vLLM's surface, without loading a model: engine flags are
generated from EngineArgs; every other `vllm serve` flag parses and is
refused naming its feature, or accepted and ignored with a logged reason."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from jaxinfer.compat.status import Ignored, Refused
from jaxinfer.compat.surface import flag_status, vllm_surface
from jaxinfer.config import EngineArgs, derived_max_model_len
from jaxinfer.entrypoints.cli import build_parser, generate_engine_args, main
from jaxinfer.entrypoints.openai.cli_args import serve_engine_args
from jaxinfer.errors import InvalidConfigError, UnsupportedFeatureError


def _serve(*argv):
    return serve_engine_args(build_parser().parse_args(["serve", "m", *argv]))


def test_every_engine_args_field_is_a_flag_with_its_default():
    ns = build_parser().parse_args(["generate"])
    for field in dataclasses.fields(EngineArgs):
        assert getattr(ns, field.name) == field.default, field.name
    # serve compiles before its port opens
    assert _serve().warmup is True


def test_generate_asks_for_one_sequence_slot_unless_told():
    # its prompts run one at a time; the CPU KV pool is sized by slots
    assert generate_engine_args(build_parser().parse_args(
        ["generate"])).max_num_seqs == 1
    assert generate_engine_args(build_parser().parse_args(
        ["generate", "--max-num-seqs", "4"])).max_num_seqs == 4
    sc = generate_engine_args(build_parser().parse_args(
        ["generate"])).scheduler_config(2048, on_cpu=True)
    assert sc.max_num_seqs == 1


def test_attention_backend_choices_are_the_models():
    from jaxinfer.models.attention import BACKENDS
    field = {f.name: f for f in dataclasses.fields(EngineArgs)}["attention_backend"]
    assert tuple(field.metadata["choices"]) == BACKENDS


@pytest.mark.parametrize("argv, field, value", [
    (["--scheduling-policy", "priority"], "scheduling_policy", "priority"),
    (["--preemption-mode", "swap"], "preemption_mode", "swap"),
    (["--swap-space", "2"], "swap_space", 2.0),
    (["-tp", "2"], "tensor_parallel_size", 2),
    (["--no-enable-prefix-caching"], "enable_prefix_caching", False),
    (["--max-logprobs", "3"], "max_logprobs", 3),
    (["--no-warmup"], "warmup", False),
])
def test_engine_flags_reach_engine_args(argv, field, value):
    assert getattr(_serve(*argv), field) == value


def test_priority_scheduling_and_swap_reach_the_scheduler_config():
    args = _serve("--scheduling-policy", "priority", "--swap-space", "1")
    sc = args.scheduler_config(4096, on_cpu=True)
    assert (sc.policy, sc.preemption_mode) == ("priority", "swap")
    assert args.cache_config().swap_space == 1.0


def test_swap_space_sizes_a_pool_only_under_swap():
    assert EngineArgs().resolved_preemption() == ("recompute", 0.0)
    assert EngineArgs().cache_config().swap_space == 0.0
    assert EngineArgs(swap_space=2).resolved_preemption() == ("swap", 2.0)
    assert EngineArgs(preemption_mode="swap").resolved_preemption() == ("swap", 4.0)
    with pytest.raises(InvalidConfigError, match="swap_space .* 'recompute'"):
        EngineArgs(preemption_mode="recompute", swap_space=4)
    with pytest.raises(InvalidConfigError, match="swap_space must be > 0"):
        EngineArgs(preemption_mode="swap", swap_space=0)


@pytest.mark.parametrize("argv, feature", [
    (["--enable-lora-bias"], "LoRA adapters with bias terms"),
    (["--tool-parser-plugin", "my_parser.py"], "tool parser plugins"),
    (["--tool-server", "demo"], "tool servers"),
    (["--kv-cache-dtype", "fp8_inc"], "'fp8_inc' KV cache"),
    (["--revision", "main"], "model hub"),
    (["-dcp", "2"], "decode context parallelism"),
    (["--guided-decoding-backend", "xgrammar"], "structured output"),
    (["--limit-mm-per-prompt", '{"video": 1}'], "multimodal"),
    (["--ssl-keyfile", "k.pem"], "TLS"),
])
def test_refused_flags_name_the_missing_feature(argv, feature):
    with pytest.raises(UnsupportedFeatureError, match=feature) as e:
        _serve(*argv)
    assert argv[0] in str(e.value) or e.value.name in vllm_flag_names(argv[0])


def test_unserved_speculative_methods_are_refused_by_name():
    with pytest.raises(UnsupportedFeatureError, match="'medusa' speculative method"):
        _serve("--speculative-config",
               '{"method": "medusa", "num_speculative_tokens": 2}')
    with pytest.raises(InvalidConfigError, match="needs 'method'"):
        _serve("--speculative-config", "{}")


def vllm_flag_names(short):
    for flag in vllm_surface()["serve_flags"]:
        if short in flag["flags"]:
            return flag["flags"]
    return []


@pytest.mark.parametrize("argv", [
    ["--kv-cache-dtype", "auto"], ["--decode-context-parallel-size", "1"],
    ["--no-enable-lora"], ["--task", "generate"], ["--max-loras", "1"],
])
def test_refused_flags_accept_their_off_value(argv):
    assert _serve(*argv).model == "m"


@pytest.mark.parametrize("flag", ["--trust-remote-code", "--enforce-eager",
                                  "--disable-log-requests", "--disable-log-stats"])
def test_ignored_flags_are_accepted_with_a_logged_reason(flag, caplog):
    with caplog.at_level(logging.WARNING, logger="jaxinfer.compat"):
        assert _serve(flag).model == "m"
    assert f"{flag}=True accepted and ignored" in caplog.text
    assert isinstance(flag_status(flag[2:].replace("-", "_")), Ignored)


def test_cli_exits_2_naming_the_feature(capsys):
    assert main(["serve", "m", "--enable-lora-bias"]) == 2
    assert "LoRA adapters with bias terms" in capsys.readouterr().err


def test_api_server_module_takes_serve_flags(capsys):
    from jaxinfer.entrypoints.openai.api_server import main as api_main
    assert api_main(["--model", "m", "--tool-server", "demo"]) == 2
    assert "tool servers" in capsys.readouterr().err


def test_host_default_and_its_help_say_localhost_only():
    parser = build_parser()
    assert parser.parse_args(["serve"]).host == "127.0.0.1"
    serve = parser._subparsers._group_actions[0].choices["serve"]
    assert "--host 0.0.0.0" in " ".join(serve.format_help().split())


def test_llm_kwargs_of_vllm_are_refused_or_ignored(caplog):
    from jaxinfer import LLM
    from jaxinfer.compat.surface import split_engine_kwargs
    with pytest.raises(UnsupportedFeatureError, match="LoRA adapters with bias"):
        LLM("m", enable_lora_bias=True)  # refused before anything loads
    with pytest.raises(TypeError, match="no_such_arg"):
        LLM("m", no_such_arg=1)
    known = {f.name for f in dataclasses.fields(EngineArgs)}
    with caplog.at_level(logging.WARNING, logger="jaxinfer.compat"):
        kept = split_engine_kwargs({"enforce_eager": True, "trust_remote_code":
                                    True, "max_num_seqs": 4}, known)
    assert kept == {"max_num_seqs": 4}
    assert "enforce_eager=True accepted and ignored" in caplog.text


def test_every_vllm_flag_has_a_status():
    """No vLLM flag falls through: each is a flag of ours or has an entry."""
    parser_flags = set()
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    native = {a.dest for a in serve._actions if flag_status(a.dest) is None}
    for flag in vllm_surface()["serve_flags"]:
        status = flag_status(flag["dest"])
        assert flag["dest"] in native or isinstance(status, (Ignored, Refused)), flag
        parser_flags.add(flag["flags"][0])
    assert parser_flags <= set(serve._option_string_actions)


def _model_config(rope):
    from jaxinfer.models import model_config_from_hf
    hf = {"architectures": ["LlamaForCausalLM"], "vocab_size": 100,
          "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
          "num_attention_heads": 4, "max_position_embeddings": 512}
    if rope:
        hf["rope_scaling"] = rope
    return model_config_from_hf(hf)


@pytest.mark.parametrize("rope, length", [
    (None, 512),
    ({"rope_type": "linear", "factor": 2.0}, 1024),
    ({"rope_type": "dynamic", "factor": 4.0}, 2048),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}, 256),
    ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64}, 512),
])
def test_max_model_len_follows_rope_scaling(rope, length):
    derived = derived_max_model_len(_model_config(rope))
    assert derived == length
    assert EngineArgs(max_model_len=length).scheduler_config(
        derived, on_cpu=False).max_model_len == length
    with pytest.raises(InvalidConfigError, match="RoPE scaling"):
        EngineArgs(max_model_len=length + 1).scheduler_config(derived, False)


def test_default_step_sizes_per_platform():
    """vLLM's large-GPU token budget (8192) and 256 seats on GPU; a small
    budget and 8 seats on CPU; an explicit budget smaller than the default
    seats caps them; chunked prefill off widens the budget to a prompt."""
    gpu = EngineArgs().scheduler_config(4096, on_cpu=False)
    assert (gpu.max_num_batched_tokens, gpu.max_num_seqs) == (8192, 256)
    cpu = EngineArgs().scheduler_config(4096, on_cpu=True)
    assert (cpu.max_num_batched_tokens, cpu.max_num_seqs) == (256, 8)
    small = EngineArgs(max_num_batched_tokens=64).scheduler_config(4096, False)
    assert (small.max_num_batched_tokens, small.max_num_seqs) == (64, 64)
    whole = EngineArgs(enable_chunked_prefill=False).scheduler_config(4096, True)
    assert whole.max_num_batched_tokens == 2048  # CPU max_model_len default
