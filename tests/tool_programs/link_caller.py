"""An ``exec`` tool program that calls the Corral API with the agent token it was given.

It reads ``CORRAL_URL`` and ``CORRAL_AGENT_TOKEN`` from its environment (planted by the
worker for an agent with links) and, by the call's ``action``:

list    GET /v1/links
info    GET /v1/links/{agent}
exec    POST /v1/links/{agent}/exec with {"input": input} (and ``wait``, when given)
raw     ``method`` ``path`` (any route: to see which refuse the token)
save    keep the token in the working directory (the agent's workspace), file ``kept.token``
exec-kept  POST /v1/links/{agent}/exec with the token ``save`` kept (an earlier call's)
leak    print the token itself (its redaction is what the test looks at)
leak-fail  write the token to stderr and exit 1

and prints {"status": HTTP status, "body": the JSON answer}. Standard library only.
"""

import json
import os
import sys
import urllib.error
import urllib.request

KEPT = "kept.token"


def request(
    method: str, path: str, body: object = None, token: str | None = None
) -> dict[str, object]:
    url = os.environ["CORRAL_URL"] + path
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", "Bearer " + (token or os.environ["CORRAL_AGENT_TOKEN"]))
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return {"status": response.status, "body": json.loads(response.read() or b"null")}
    except urllib.error.HTTPError as error:
        return {"status": error.code, "body": json.loads(error.read() or b"null")}


def main() -> None:
    arguments = json.load(sys.stdin)
    action = arguments["action"]
    agent = arguments.get("agent", "")
    if action == "list":
        result = request("GET", "/v1/links")
    elif action == "info":
        result = request("GET", f"/v1/links/{agent}")
    elif action == "exec":
        body = {"input": arguments["input"]}
        if "wait" in arguments:
            body["wait"] = arguments["wait"]
        result = request("POST", f"/v1/links/{agent}/exec", body)
    elif action == "save":
        with open(KEPT, "w") as kept:
            kept.write(os.environ["CORRAL_AGENT_TOKEN"])
        result = {"saved": True}
    elif action == "exec-kept":
        with open(KEPT) as kept:
            token = kept.read()
        body = {"input": arguments["input"]}
        result = request("POST", f"/v1/links/{agent}/exec", body, token)
    elif action == "raw":
        result = request(arguments["method"], arguments["path"])
    elif action == "leak":
        print("my token is " + os.environ["CORRAL_AGENT_TOKEN"], file=sys.stderr)
        result = {"token": os.environ["CORRAL_AGENT_TOKEN"]}
    elif action == "leak-fail":
        sys.exit("failed holding " + os.environ["CORRAL_AGENT_TOKEN"])
    else:
        sys.exit(f"unknown action {action!r}")
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
