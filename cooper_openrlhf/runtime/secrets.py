"""Secrets out of every command this package prints, logs or records.

Launch records (launch.json, the lab's command.txt), dry runs and job logs are copied into papers, issues and shared
folders; a key in them is a leaked key. What counts as a secret, decided here once:
  - the value of a flag that carries one (SECRET_FLAGS: the wandb key; `--flag VALUE` or `--flag=VALUE`);
  - a credential in a URL's query (`?token=...`, also `access_token`, `api_key`, `key`, `secret`, `password`) or
    its user-info (`https://user:PASSWORD@host`): the reward service's token in `--reward.remote_url`;
  - the value of an environment variable whose name says it holds one (WANDB_API_KEY, HF_TOKEN, ..., SECRET_ENV);
  - those values wherever else they appear in a text (`scrub`).
Everything else is kept word for word: a record must still say what ran.

`python -m cooper_openrlhf.runtime.secrets WORD...` prints the words as a shell line (`+ ...`, bash's `%q`
quoting), redacted: the launchers' DRY_RUN output goes through it. The module imports nothing heavy (no torch).
"""

import argparse
import re
import shlex
import sys
import types
from collections.abc import Iterable, Mapping

REDACTED = "***"
# A wandb key flag's value meaning "the key is in WANDB_API_KEY": what the launchers and the lab pass, so that the
# key itself never reaches a command line (`ps`, Ray's job list) or a record. wandb reads the variable itself;
# train_cooper checks at start-up that it is set (`resolve_env_reference`).
WANDB_KEY_FROM_ENV = "env:WANDB_API_KEY"
ENV_REFERENCE = "env:"
# Flags whose value is a secret (OpenRLHF's and verifyrm train's wandb key; the wandb key the launchers take from
# WANDB_API_KEY never reaches a command line at all).
SECRET_FLAGS = ("--logger.wandb.key",)
# Environment variables that hold secrets: these names, and any name ending in one of SECRET_ENV_SUFFIXES.
SECRET_ENV = ("WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN", "OPENAI_API_KEY")
SECRET_ENV_SUFFIXES = ("_TOKEN", "_API_KEY", "_SECRET", "_PASSWORD", "_ACCESS_KEY")
_QUERY_SECRET = re.compile(r"([?&](?:token|access_token|api_key|apikey|key|secret|password)=)[^&#\s'\"]+", re.I)
_USERINFO = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/@\s:'\"]+:)[^/@\s'\"]+(@)", re.I)


class MissingSecretError(ValueError):
    """A flag names an environment variable (`env:NAME`) that is not set."""


def resolve_env_reference(flag: str, value: str | None, environ: Mapping[str, str]) -> str | None:
    """`value`, or for `env:NAME` the value of NAME in `environ` (MissingSecretError naming both when unset)."""
    if value is None or not value.startswith(ENV_REFERENCE):
        return value
    name = value[len(ENV_REFERENCE):]
    if not environ.get(name):
        raise MissingSecretError(f"{flag} {value}: {name} is not set in the environment")
    return environ[name]


def is_secret_env(name: str) -> bool:
    upper = name.upper()
    return upper in SECRET_ENV or upper.endswith(SECRET_ENV_SUFFIXES)


def redact_url(text: str) -> str:
    """`text` with the credentials of every URL in it replaced (query tokens, user-info passwords)."""
    return _USERINFO.sub(rf"\g<1>{REDACTED}\g<2>", _QUERY_SECRET.sub(rf"\g<1>{REDACTED}", text))


def secret_values(environ: Mapping[str, str]) -> list[str]:
    """The values of the secret variables of `environ` (long enough to be told apart from ordinary words)."""
    return sorted({value for name, value in environ.items() if is_secret_env(name) and len(value) >= 8},
                  key=len, reverse=True)


def scrub(text: str, environ: Mapping[str, str] | None = None) -> str:
    """`text` with URL credentials and every secret value of `environ` (default: none) replaced."""
    text = redact_url(text)
    for value in secret_values(environ or {}):
        text = text.replace(value, REDACTED)
    return text


def redact_argv(argv: Iterable[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """A command with its secrets replaced, word for word otherwise (same length, same order)."""
    words, out = list(argv), []
    for index, word in enumerate(words):
        flag = word.split("=", 1)[0]
        if word.startswith(ENV_REFERENCE) or flag in SECRET_FLAGS and word.split("=", 1)[-1].startswith(ENV_REFERENCE):
            out.append(word)  # names the variable that holds the secret, not the secret
        elif index and words[index - 1] in SECRET_FLAGS:
            out.append(REDACTED)
        elif flag in SECRET_FLAGS and "=" in word:
            out.append(f"{flag}={REDACTED}")
        else:
            out.append(scrub(word, environ))
    return out


def redact_env(values: Mapping[str, str]) -> dict[str, str]:
    """Environment variables with secret ones' values replaced (and URL credentials in the others)."""
    return {name: REDACTED if is_secret_env(name) and value else scrub(str(value), values)
            for name, value in values.items()}


def redact_namespace(args, environ: Mapping[str, str] | None = None, _prefix: str = ""):
    """A copy of an (OpenRLHF hierarchized) argparse namespace with secret flags' values and URL credentials
    replaced: what `strategy.print(args)` may show."""
    copy = type(args)()
    for name, value in vars(args).items():
        dotted = f"{_prefix}{name}"
        if isinstance(value, (argparse.Namespace, types.SimpleNamespace)):  # OpenRLHF's groups are SimpleNamespaces
            value = redact_namespace(value, environ, f"{dotted}.")
        elif isinstance(value, str):
            secret = f"--{dotted}" in SECRET_FLAGS and value and not value.startswith(ENV_REFERENCE)
            value = REDACTED if secret else scrub(value, environ)
        setattr(copy, name, value)
    return copy


def shell_line(argv: Iterable[str], environ: Mapping[str, str] | None = None) -> str:
    """The command as one shell line, redacted (what a dry run prints)."""
    return shlex.join(redact_argv(argv, environ))


def main(argv: list[str] | None = None) -> int:
    import os

    words = sys.argv[1:] if argv is None else argv
    print("+ " + shell_line(words, os.environ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
