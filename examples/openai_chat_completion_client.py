"""The OpenAI client's chat API against `jaxinfer serve` (vLLM's chat
client example; only the server changed). Start a server first:

    jaxinfer serve smollm2-135m-instruct --port 8000
    python examples/openai_chat_completion_client.py [--stream]

JAXINFER_API_BASE overrides the server address.
"""

import argparse
import os

from openai import OpenAI

openai_api_key = "EMPTY"
openai_api_base = os.environ.get("JAXINFER_API_BASE", "http://localhost:8000/v1")

messages = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Who won the world series in 2020?"},
    {"role": "assistant", "content": "The Los Angeles Dodgers won the World Series in 2020."},
    {"role": "user", "content": "Where was it played?"},
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args()
    client = OpenAI(api_key=openai_api_key, base_url=openai_api_base)
    model = client.models.list().data[0].id

    chat_completion = client.chat.completions.create(
        messages=messages, model=model, stream=args.stream, max_tokens=32)
    print("-" * 50)
    print("Chat completion results:")
    if args.stream:
        for c in chat_completion:
            print(c)
    else:
        print(chat_completion)
    print("-" * 50)


if __name__ == "__main__":
    main()
