"""vLLM options a profile sets through extra_args, read the way vLLM's parser reads them, for `lynxtop check`.

The typed profile keys own the common flags (contract/config.py OWNED_FLAGS); decode context parallel and
speculative decoding have no typed key, so the check reads them from extra_args. vLLM's FlexibleArgumentParser
(vllm/utils/argparse_utils.py) turns `_` into `-` in a long flag's name (up to the first `.`), splits
`--flag=value`, reads `--flag.key v` as `--flag '{"key": v}'` (merged into the JSON), and argparse keeps the last
use of a flag and, with allow_abbrev on, expands an unambiguous prefix (`--decode-context 8`). Pure functions:
nothing is started or read.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lynxtop.contract.config import dotted_conflict

DCP_FLAGS = ("--decode-context-parallel-size", "-dcp")
PCP_FLAGS = ("--prefill-context-parallel-size", "-pcp")
SPEC_FLAG = "--speculative-config"
# the shortest prefix taken for each long flag: past its first word, where no other vLLM flag shares it
_SHORTEST = {"--decode-context-parallel-size": "--decode-c", "--prefill-context-parallel-size": "--prefill-c",
             SPEC_FLAG: "--speculative-c"}


@dataclass(frozen=True)
class ExtraOptions:
    """What extra_args ask of vLLM beyond the typed keys; an `*_error` says, in words, why vLLM would refuse it."""

    dcp: int = 1  # decode context parallel size
    dcp_token: str = ""  # as written, for the messages
    dcp_error: str = ""
    pcp: int = 1  # prefill context parallel size (changes the DCP rule)
    spec: dict[str, Any] | None = None  # --speculative-config, merged with its dotted keys
    spec_error: str = ""


def _name(token: str) -> str:
    """A flag's name as vLLM normalises it: `--a_b=1` -> `--a-b`, `--a_b.c` -> `--a-b.c`."""
    written = token.split("=", 1)[0]
    if not written.startswith("--"):
        return written
    head, dot, rest = written[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + rest


def _is(name: str, names: Sequence[str]) -> bool:
    """`name` is one of `names`, or a prefix argparse expands to one of the long ones."""
    return name in names or any(n.startswith(name) and name.startswith(_SHORTEST.get(n, n)) for n in names)


def flag_values(args: Sequence[str], names: Sequence[str]) -> list[tuple[str, str | None]]:
    """(the token as written, its value) for each use of one of `names` in `args`; value None: none follows."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if _is(_name(tok), names):
            if "=" in tok:
                out.append((tok, tok.split("=", 1)[1]))
                i += 1
                continue
            out.append((tok, args[i + 1] if i + 1 < len(args) else None))
            i += 2
            continue
        i += 1
    return out


def _int_flag(args: Sequence[str], names: Sequence[str]) -> tuple[int, str, str]:
    """(value, token, error) of the last use of an integer flag; (1, "", "") when absent."""
    uses = flag_values(args, names)
    if not uses:
        return 1, "", ""
    token, value = uses[-1]
    shown = token if "=" in token else f"{token} {value}"
    try:
        number = int(value) if value is not None else None
    except ValueError:
        number = None
    if number is None or number < 1:
        return 1, shown, f"{shown} in extra_args: vLLM takes a whole number of at least 1 there"
    return number, shown, ""


def _dotted(args: Sequence[str]) -> tuple[dict[str, Any], str]:
    """`--speculative-config.key value` uses, as one dict (a JSON value, else the string); error in words. A key
    set inside one that an earlier use gave a non-object value is refused (dotted_conflict, as `config check`)."""
    out: dict[str, Any] = {}
    conflict = dotted_conflict(args, SPEC_FLAG)
    if conflict:
        return out, conflict + " (in extra_args)"
    i = 0
    while i < len(args):
        tok = args[i]
        name = _name(tok)
        if not name.startswith(SPEC_FLAG + "."):
            i += 1
            continue
        keys = name[len(SPEC_FLAG) + 1:].split(".")
        if "=" in tok:
            value, i = tok.split("=", 1)[1], i + 1
        elif i + 1 < len(args):
            value, i = args[i + 1], i + 2
        else:
            return out, f"{tok} in extra_args has no value"
        try:
            parsed: Any = json.loads(value)
        except (ValueError, RecursionError):
            parsed = value
        node = out
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = parsed
    return out, ""


def _spec(args: Sequence[str]) -> tuple[dict[str, Any] | None, str]:
    uses = flag_values(args, (SPEC_FLAG,))
    dotted, error = _dotted(args)
    if error:
        return None, error
    if not uses:
        return (dotted or None), ""
    token, value = uses[-1]
    if value is None:
        return None, f"{token} in extra_args has no value (vLLM takes a JSON object)"
    try:
        spec = json.loads(value)
    except json.JSONDecodeError as exc:
        return None, f"{token}'s value in extra_args is not JSON ({exc.msg} at character {exc.pos}): vLLM refuses it"
    except (ValueError, RecursionError) as exc:  # an integer of too many digits; arrays nested too deep
        why = "nested too deep" if isinstance(exc, RecursionError) else "an integer of too many digits"
        return None, f"{token}'s value in extra_args cannot be read as JSON ({why}): vLLM refuses it"
    if not isinstance(spec, dict):
        return None, f"{token}'s value in extra_args is JSON but not an object: vLLM takes {{\"method\": ...}}"
    return spec | dotted, ""


def extra_options(args: Sequence[str]) -> ExtraOptions:
    dcp, dcp_token, dcp_error = _int_flag(args, DCP_FLAGS)
    pcp, _, _ = _int_flag(args, PCP_FLAGS)
    spec, spec_error = _spec(args)
    return ExtraOptions(dcp=dcp, dcp_token=dcp_token, dcp_error=dcp_error, pcp=pcp, spec=spec, spec_error=spec_error)
