"""`cooper serve`'s flags as a user meets them: every flag has a help line and shows its default; a model that is
not a VerifyRM given as --rm is one `error:` line saying what was expected and how to make one; a service reachable
beyond this machine over plain http says so at start-up; the connection cap gets the file descriptors it needs."""

import argparse
import resource

import pytest

from cooper_openrlhf.cli.serve import build_parser, main, plain_http_warning
from cooper_openrlhf.serve.build import open_files_for


def test_every_flag_has_a_help_line_and_shows_its_default():
    parser = build_parser()
    flags = [action for action in parser._actions if not isinstance(action, argparse._HelpAction)]
    assert len(flags) > 60
    missing = [action.option_strings[0] for action in flags if not (action.help or "").strip()]
    assert missing == []
    text = parser.format_help()
    for action in flags:
        shown = parser._get_formatter()._get_help_string(action)
        assert "%(default)s" in shown, action.option_strings  # the formatter adds "(default: ...)" to each
    assert "--port PORT           port to listen on (default: 5000)" in text


@pytest.mark.parametrize("model, found", [
    ("tiny-qwen2-policy", "is not a sequence classifier (architectures ['Qwen2ForCausalLM'], model_type 'qwen2')"),
    (None, "is a folder without config.json: not a Hugging Face model folder"),
])
def test_a_model_that_is_not_a_verifyrm_is_one_error_line_saying_what_and_how(capsys, model_dir, tmp_path, model,
                                                                               found):
    rm = model_dir(model) if model else str(tmp_path)
    assert main(["--rm", rm, "--policy", model_dir("tiny-qwen2-policy")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --rm {rm} {found}: expected a VerifyRM (a one-logit sequence classifier). Make one from a "
                   f"model: cooper verifyrm train --model.model_name_or_path MODEL --init-head --data.dataset "
                   f"ROWS.jsonl --ckpt.output_dir OUT, then --rm OUT (docs/verifyrm.md)"]


def test_a_verifyrm_passes_the_check(capsys, model_dir):
    from cooper_openrlhf.cli.serve import check_args

    args = build_parser().parse_args(["--rm", model_dir("tiny-qwen2-rm"), "--no-chat-template"])
    assert check_args(args) == []


def test_plain_http_beyond_loopback_is_warned_and_nothing_else_is():
    def warning(*argv):
        return plain_http_warning(build_parser().parse_args(["--rm", "r", *argv]))

    assert warning("--host", "127.0.0.1") is None and warning("--host", "localhost") is None
    assert warning("--host", "0.0.0.0", "--ssl-certfile", "c.pem", "--ssl-keyfile", "k.pem") is None
    assert warning("--host", "0.0.0.0").startswith("listening on 0.0.0.0 over plain http: the token and every sample")


def test_the_open_files_limit_is_raised_to_fit_the_connection_cap():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        wanted = min(soft + 100, hard if hard != resource.RLIM_INFINITY else soft + 100) - 1024
        assert open_files_for(wanted) is None
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= wanted + 1024
        if hard != resource.RLIM_INFINITY:
            assert "raise it (ulimit -n) or lower --max-connections" in open_files_for(hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
