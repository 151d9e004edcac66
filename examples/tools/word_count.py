"""The ``word-count`` exec tool: JSON arguments on stdin, a JSON result on stdout.

Input: ``{"text": "..."}``. Output: ``{"words": N, "characters": M}``.
A bad input is reported on stderr with exit status 2.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    """Count the words of ``text`` read from the JSON object on stdin."""
    try:
        args = json.load(sys.stdin)
    except json.JSONDecodeError as exc:
        print(f"input is not JSON: {exc}", file=sys.stderr)
        return 2
    text = args.get("text") if isinstance(args, dict) else None
    if not isinstance(text, str):
        print("expected an object with a string field 'text'", file=sys.stderr)
        return 2
    json.dump({"words": len(text.split()), "characters": len(text)}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
