"""A client of the simple demo server's ``/generate`` (vLLM's api_client
example; only the server changed). Start the server first:

    python -m jaxinfer.entrypoints.api_server --model smollm2-135m-instruct --port 8000
    python examples/api_client.py --port 8000 [--stream] [--n 2]
"""

import argparse
import json

import requests


def post_http_request(prompt: str, api_url: str, n: int = 1,
                      stream: bool = False) -> requests.Response:
    headers = {"User-Agent": "Test Client"}
    pload = {
        "prompt": prompt,
        "n": n,
        "temperature": 0.0 if n == 1 else 0.8,
        "max_tokens": 16,
        "stream": stream,
    }
    return requests.post(api_url, headers=headers, json=pload, stream=stream,
                         timeout=120)


def get_streaming_response(response: requests.Response):
    for chunk in response.iter_lines(chunk_size=8192, decode_unicode=False,
                                     delimiter=b"\n"):
        if chunk:
            yield json.loads(chunk.decode("utf-8"))["text"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", type=str, default="localhost")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--prompt", type=str, default="San Francisco is a")
    parser.add_argument("--stream", action="store_true")
    args = parser.parse_args()
    api_url = f"http://{args.host}:{args.port}/generate"
    print(f"Prompt: {args.prompt!r}\n", flush=True)
    response = post_http_request(args.prompt, api_url, args.n, args.stream)
    response.raise_for_status()
    if args.stream:
        for texts in get_streaming_response(response):
            for i, line in enumerate(texts):
                print(f"Beam candidate {i}: {line!r}", flush=True)
    else:
        for i, line in enumerate(response.json()["text"]):
            print(f"Beam candidate {i}: {line!r}", flush=True)


if __name__ == "__main__":
    main()
