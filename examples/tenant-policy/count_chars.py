"""The tenant-policy example's program: count the characters of a text (JSON on stdin)."""

import json
import sys

text = json.load(sys.stdin)["text"]
print(json.dumps({"characters": len(text)}))
