"""Scoped agent tokens: what a run's tool programs use to call its linked agents over the API.

An agent with ``links`` gets, in the environment of each ``exec`` tool call,
``CORRAL_AGENT_TOKEN`` (a JWT, HS256) and ``CORRAL_URL`` (the server's URL, when
the worker knows it). The token's claims say who calls and what it may reach:
``ns`` (namespace), ``agent``, ``run`` (the calling run: the parent of any child it
starts), ``links`` (the names of the linked agents), ``iat``/``exp`` (a fresh
token per call, valid :data:`TOKEN_SECONDS`), ``iss`` and ``aud``, and, when the calling
run has limits, ``cost_left``/``tokens_left``: what it had left of its ``max_cost_usd`` /
``max_tokens`` when the call started, ``call`` (the call's step and index in its run)
and ``seq`` (the run's journal position then: a token whose call's step has ended starts
no child, see :func:`~corral.runtime.delegation.token_call_ended`): the children a token
starts share what it carries (the server caps each at what
the call's earlier children leave: see :class:`~corral.store.base.Allowance`). The server
accepts it only on ``/v1/links`` (see :mod:`corral.server.routes_links`).

The signing key is derived (HKDF-SHA256) from the store's secret key
(``CORRAL_SECRET_KEY`` or ``$CORRAL_HOME/secret.key``, see
:mod:`corral.resources.secrets`), so every worker and server of a deployment
agrees on it without a key of its own, and it rotates with the secret key: the
first key signs, every listed key verifies.
"""

from __future__ import annotations

import math
import re
import secrets as _secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from corral.core.settings import Settings
from corral.resources.secrets import SecretCipher

#: how long a token is valid: a fresh one is minted for every tool call
TOKEN_SECONDS = 15 * 60
ISSUER = "corral"
AUDIENCE = "corral:links"
#: the environment variables a tool program receives
TOKEN_VARIABLE = "CORRAL_AGENT_TOKEN"
URL_VARIABLE = "CORRAL_URL"
#: how redaction names the token (``[REDACTED:agent_token]``)
REDACTION_NAME = "agent_token"
_ALGORITHM = "HS256"
_CALL = re.compile(r"[0-9]{1,9}:[0-9]{1,9}")
_HKDF_INFO = b"corral agent token v1"


@dataclass(frozen=True)
class AgentClaims:
    """Who a verified agent token speaks for."""

    namespace: str
    agent: str
    run_id: str
    links: tuple[str, ...]
    expires_at: float
    #: what the calling run had left of its limits when the token was minted (``None``:
    #: no limit): the caps of a child the token starts
    cost_left: float | None = None
    tokens_left: int | None = None
    #: the tool call the token was minted for (``STEP:INDEX``; ``None`` in a token minted
    #: before calls were named): its children share the budget claims
    call: str | None = None
    #: the run's journal position when the token was minted: the server looks after it
    #: for the end of the call's step (a token outlives its call by its expiry otherwise)
    seq: int | None = None


class AgentTokenError(Exception):
    """A token that cannot be accepted; ``code`` is ``token_expired`` or ``token_invalid``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def looks_like_agent_token(text: str) -> bool:
    """Whether a bearer token has the shape of a JWT (API tokens start ``corral_``)."""
    return text.count(".") == 2 and text.startswith("eyJ")


class AgentTokenSigner:
    """Mints and verifies agent tokens with keys derived from the secret key(s)."""

    def __init__(
        self,
        secret_keys: Callable[[], Sequence[str]],
        *,
        now: Callable[[], float] = time.time,
        ttl_seconds: float = TOKEN_SECONDS,
    ) -> None:
        """``secret_keys``: the secret keys, current first (read on first use); ``now``: the
        wall clock tokens are minted and checked by (a seam for tests)."""
        self._secret_keys = secret_keys
        self._keys: list[bytes] | None = None
        self.now = now
        self.ttl_seconds = ttl_seconds

    @staticmethod
    def from_settings(
        settings: Settings, *, now: Callable[[], float] = time.time
    ) -> AgentTokenSigner:
        """The signer of the deployment's secret key (read, or created, on first use)."""
        cipher = SecretCipher.from_settings(settings)
        return AgentTokenSigner(cipher.keys, now=now)

    def _signing_keys(self) -> list[bytes]:
        if self._keys is None:
            self._keys = [_derive(key) for key in self._secret_keys()]
        return self._keys

    def mint(
        self,
        *,
        namespace: str,
        agent: str,
        run_id: str,
        links: Sequence[str],
        ttl_seconds: float | None = None,
        cost_left: float | None = None,
        tokens_left: int | None = None,
        call: str | None = None,
        seq: int | None = None,
    ) -> str:
        """A token for run ``run_id`` of ``agent``, valid ``ttl_seconds`` (default the signer's),
        carrying what the run has left of its limits (``None``: no limit)."""
        now = self.now()
        claims = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": f"{namespace}/{agent}",
            "ns": namespace,
            "agent": agent,
            "run": run_id,
            "links": list(links),
            "iat": int(now),
            "exp": int(now + (self.ttl_seconds if ttl_seconds is None else ttl_seconds)),
            "jti": _secrets.token_urlsafe(9),
        }
        optional = {"cost_left": cost_left, "tokens_left": tokens_left, "call": call, "seq": seq}
        claims.update({name: value for name, value in optional.items() if value is not None})
        return jwt.encode(claims, self._signing_keys()[0], algorithm=_ALGORITHM)

    def verify(self, token: str) -> AgentClaims:
        """The claims of a valid token; :class:`AgentTokenError` otherwise."""
        claims: Mapping[str, object] | None = None
        for key in self._signing_keys():  # the current key first, then the previous ones
            try:
                claims = jwt.decode(
                    token,
                    key,
                    algorithms=[_ALGORITHM],
                    audience=AUDIENCE,
                    issuer=ISSUER,
                    options={"require": ["exp", "iat", "iss", "aud"], "verify_exp": False},
                    leeway=60,  # the clocks of the worker that minted it and this one
                )
            except jwt.InvalidSignatureError:
                continue
            except jwt.PyJWTError:
                raise AgentTokenError("token_invalid", "the agent token is not valid") from None
            break
        if claims is None:
            raise AgentTokenError("token_invalid", "the agent token is not valid")
        # expiry checked by the signer's clock (the seam for tests), not PyJWT's
        expires_at = claims.get("exp")
        if not isinstance(expires_at, int | float) or expires_at <= self.now():
            raise AgentTokenError("token_expired", "the agent token has expired")
        try:
            return AgentClaims(
                namespace=_text(claims, "ns"),
                agent=_text(claims, "agent"),
                run_id=_text(claims, "run"),
                links=tuple(_links(claims.get("links"))),
                expires_at=float(expires_at),
                cost_left=_left(claims.get("cost_left"), float),
                tokens_left=_left(claims.get("tokens_left"), int),
                call=_call(claims.get("call")),
                seq=_left(claims.get("seq"), int),
            )
        except ValueError:
            raise AgentTokenError("token_invalid", "the agent token is not valid") from None


class AgentTokenIssuer:
    """What the worker plants in a tool call's environment: a fresh token and the URL."""

    def __init__(self, signer: AgentTokenSigner, url: Callable[[], str | None]) -> None:
        self.signer = signer
        self.url = url

    def environment(
        self,
        *,
        namespace: str,
        agent: str,
        run_id: str,
        links: Sequence[str],
        cost_left: float | None = None,
        tokens_left: int | None = None,
        call: str | None = None,
        seq: int | None = None,
    ) -> dict[str, str]:
        """``CORRAL_AGENT_TOKEN`` and (when known) ``CORRAL_URL`` for one call."""
        token = self.signer.mint(
            namespace=namespace,
            agent=agent,
            run_id=run_id,
            links=links,
            cost_left=cost_left,
            tokens_left=tokens_left,
            call=call,
            seq=seq,
        )
        env = {TOKEN_VARIABLE: token}
        url = self.url()
        if url:
            env[URL_VARIABLE] = url
        return env


def _derive(secret_key: str) -> bytes:
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_HKDF_INFO)
    return hkdf.derive(secret_key.strip().encode("utf-8"))


def _text(claims: Mapping[str, object], name: str) -> str:
    value = claims.get(name)
    if not isinstance(value, str) or not value:
        raise ValueError(name)
    return value


def _links(value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("links")
    return [str(v) for v in value]


def _left(value: object, kind: type[float] | type[int]) -> Any:
    """An optional ``cost_left``/``tokens_left`` claim: absent, or a finite number >= 0
    (tokens: a whole one)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("left")
    if not math.isfinite(value) or value < 0 or (kind is int and value != int(value)):
        raise ValueError("left")
    return kind(value)


def _call(value: object) -> str | None:
    """An optional ``call`` claim: absent, or ``STEP:INDEX``."""
    if value is None:
        return None
    if not isinstance(value, str) or _CALL.fullmatch(value) is None:
        raise ValueError("call")
    return value
