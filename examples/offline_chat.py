"""Offline chat through the model's chat template (``LLM.chat``), as in
vLLM's chat example, with ``vllm`` replaced by ``jaxinfer``.

    python examples/offline_chat.py [MODEL]
"""

import sys

from jaxinfer import LLM, SamplingParams


def print_outputs(outputs):
    for output in outputs:
        print(f"Prompt: {output.prompt!r}")
        print(f"Generated text: {output.outputs[0].text!r}")
    print("-" * 80)


def main():
    llm = LLM(model=sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct")
    sampling_params = SamplingParams(temperature=0.5, max_tokens=32)
    conversation = [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hello! How can I assist you today?"},
        {"role": "user", "content": "Write an essay about the importance of higher education."},
    ]
    print_outputs(llm.chat(conversation, sampling_params, use_tqdm=False))
    # A batch of conversations in one call.
    print_outputs(llm.chat([conversation] * 3, sampling_params, use_tqdm=False))


if __name__ == "__main__":
    main()
