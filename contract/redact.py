"""Secret environment values, shown as `***<short hash>` wherever a profile's env is served, printed or stored.

A profile's env reaches vLLM as written (HF_TOKEN for gated weights, VLLM_API_KEY for `--api-key`), but anyone
who can read the control socket, a backup of the database or `config check`'s output must not learn it. A masked
value still tells two values apart (a switch diff shows that the token changed), and an unchanged value keeps
its mask across runs. The hash is SHA-256 of the value, cut to 8 hex digits: it confirms a guess of a short
password, so a secret should be a random token, as HF and API keys are. Imports nothing else of the project.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from typing import Any

# A name holding one of these (any case) is secret; `[agent] secret_env` names more, and every variable read from
# an env_file or a systemd credential is secret too. Whatever the name, a URL's credentials (`https://USER:PASSWORD@
# host`) are secret wherever env values or argv are shown or stored (mask_url_credentials).
SECRET_NAME_PARTS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "CREDENTIAL")
MASK_PREFIX = "***"
_MASKED = re.compile(r"\*\*\*[0-9a-f]{8}")
# scheme://USERINFO@: the userinfo is everything up to the authority's last '@' (a URL client reads it so: RFC 3986's
# authority ends at the first '/', '?' or '#'); quotes end it too, for a URL inside a JSON value
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/?#\s\"'<>]*)@")
FLAG_ENV_PREFIX = "env "  # Profile.flags() shows env variables as "env NAME"
_ASSIGN = re.compile(r"(-{0,2})([A-Za-z_][A-Za-z0-9_.-]*)=(.*)", re.DOTALL)  # NAME=value, --name=value


def is_secret_name(name: str, secret_names: Collection[str] = ()) -> bool:
    upper = name.upper()
    return name in secret_names or any(part in upper for part in SECRET_NAME_PARTS)


def mask(value: str) -> str:
    """`***` and 8 hex digits of the value's SHA-256; a value already masked is returned as it is."""
    if _MASKED.fullmatch(value):
        return value
    import hashlib  # here, not at import: loading OpenSSL is 5-40 ms of every start, and most never mask a value

    return MASK_PREFIX + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def _mask_userinfo(m: re.Match[str]) -> str:
    user, colon, password = m.group("userinfo").partition(":")
    # USER:PASSWORD keeps the user; a userinfo without ':' is most often a token itself (https://TOKEN@host)
    shown = f"{user}:{mask(password) if password else ''}" if colon else mask(user) if user else ""
    return f"{m.group('scheme')}{shown}@"


def mask_url_credentials(text: str) -> str:
    """`text` with the credentials of every URL in it masked (`https://ops:***1a2b3c4d@host`); else as it is."""
    return _URL_USERINFO.sub(_mask_userinfo, text) if "://" in text else text


def redact_env(env: Mapping[str, str], secret_names: Collection[str] = ()) -> dict[str, str]:
    """`env` with the value of every secret name masked, and a URL's credentials in any other value: what may be
    served, printed, logged or stored."""
    return {k: mask(v) if is_secret_name(k, secret_names) else mask_url_credentials(v) for k, v in env.items()}


def redact_argv(argv: Iterable[str], secret_names: Iterable[str] = ()) -> list[str]:
    """A command line as it may be served, printed or stored: the value of every secret-looking flag or assignment
    masked (`--api-key X`, `--hf-token=X`, `HF_TOKEN=X`: a foreign process's, as the processes view shows them;
    a profile's extra_args refuse such flags, contract/config.py), and a URL's credentials in any argument."""
    names = frozenset(secret_names)
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if not isinstance(arg, str):
            out.append(arg)
        elif mask_next:
            out.append(mask(arg))
            mask_next = False
        elif (m := _ASSIGN.fullmatch(arg)) and is_secret_name(m.group(2).replace("-", "_"), names):
            out.append(f"{m.group(1)}{m.group(2)}={mask(m.group(3))}")
        elif arg.startswith("-") and "=" not in arg and is_secret_name(arg.lstrip("-").replace("-", "_"), names):
            out.append(arg)
            mask_next = True
        else:
            out.append(mask_url_credentials(arg))
    return out


def redact_flags(flags: Any, secret_names: Collection[str] = ()) -> Any:
    """Profile.flags()-shaped data with its secret "env NAME" values masked, and a URL's credentials in any other
    flag or value (anything else as it is): for what reaches the runs table, and for rows written before values
    were masked."""
    if not isinstance(flags, dict):
        return flags
    out = {}
    for key, value in flags.items():
        if (isinstance(key, str) and key.startswith(FLAG_ENV_PREFIX) and isinstance(value, str)
                and is_secret_name(key[len(FLAG_ENV_PREFIX):], secret_names)):
            value = mask(value)
        elif isinstance(value, str):
            value = mask_url_credentials(value)
        out[mask_url_credentials(key) if isinstance(key, str) else key] = value
    return out
