"""Offline batched generation, as in vLLM's basic offline example, with
``vllm`` replaced by ``jaxinfer``. Runs the embedded SmolLM2-135M-Instruct;
pass a local model folder as the first argument to use another model.

    python examples/offline_inference.py [MODEL]
"""

import sys

from jaxinfer import LLM, SamplingParams

prompts = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95)


def main():
    llm = LLM(model=sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m-instruct")
    outputs = llm.generate(prompts, sampling_params)
    print("\nGenerated Outputs:\n" + "-" * 60)
    for output in outputs:
        print(f"Prompt:    {output.prompt!r}")
        print(f"Output:    {output.outputs[0].text!r}")
        print("-" * 60)


if __name__ == "__main__":
    main()
