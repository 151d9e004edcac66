"""``corral token create|list|revoke`` as an operator types them: real processes, one store."""

from __future__ import annotations

import json
from pathlib import Path

from corral.core.tokens import parse_token
from test_cli_run import corral


def test_create_prints_the_token_once_list_hides_it_and_revoke_ends_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    created = corral(home, "token", "create", "-n", "team-a", "--role", "operator", check=0)
    plain = created.stdout.strip()
    parsed = parse_token(plain)
    assert parsed is not None
    token_id, secret = parsed
    assert "operator in namespace 'team-a'" in created.stderr

    listed = json.loads(corral(home, "token", "list", "-o", "json", check=0).stdout)
    assert [(t["id"], t["namespace"], t["role"]) for t in listed] == [
        (token_id, "team-a", "operator")
    ]
    assert secret not in json.dumps(listed) and listed[0]["revoked_at"] is None

    assert corral(home, "token", "revoke", token_id, check=0).stdout.strip().endswith("revoked")
    listed = json.loads(corral(home, "token", "list", "-o", "json", check=0).stdout)
    assert listed[0]["revoked_at"] is not None


def test_an_unknown_role_or_token_is_bad_input(tmp_path: Path) -> None:
    home = tmp_path / "home"
    bad_role = corral(home, "token", "create", "-n", "x", "--role", "root", check=2)
    assert "unknown role" in bad_role.stderr
    assert "not found" in corral(home, "token", "revoke", "tok_nope", check=2).stderr
