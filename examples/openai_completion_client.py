"""The OpenAI client against `jaxinfer serve` (vLLM's completion client
example; only the server changed). Start a server first:

    jaxinfer serve smollm2-135m-instruct --port 8000
    python examples/openai_completion_client.py [--stream]

JAXINFER_API_BASE overrides the server address.
"""

import argparse
import os

from openai import OpenAI

openai_api_key = "EMPTY"
openai_api_base = os.environ.get("JAXINFER_API_BASE", "http://localhost:8000/v1")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args()
    client = OpenAI(api_key=openai_api_key, base_url=openai_api_base)
    model = client.models.list().data[0].id

    completion = client.completions.create(
        model=model,
        prompt="A robot may not injure a human being",
        echo=False,
        n=2,
        stream=args.stream,
        logprobs=3,
    )
    print("-" * 50)
    print("Completion results:")
    if args.stream:
        for c in completion:
            print(c)
    else:
        print(completion)
    print("-" * 50)


if __name__ == "__main__":
    main()
