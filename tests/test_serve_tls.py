"""`cli.serve --ssl-certfile/--ssl-keyfile`: the service speaks HTTPS (uvicorn's own TLS), so the token that
OpenRLHF's client must carry in the URL never crosses the network in clear text."""

import os
import subprocess
import sys
import time

import pytest
import requests

TOKEN = "tls-token-0123456789abcdef"


def _self_signed(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


@pytest.mark.skipif(not any(os.access(os.path.join(d, "openssl"), os.X_OK) for d in os.environ["PATH"].split(":")),
                    reason="needs the openssl command to make a certificate")
def test_the_service_serves_https_with_the_given_certificate(model_dir, tmp_path):
    from test_serve_e2e import free_port

    cert, key = _self_signed(tmp_path)
    (tmp_path / "token").write_text(TOKEN)
    port = free_port()
    argv = [sys.executable, "-m", "cooper_openrlhf.cli.serve", "--rm", model_dir("tiny-qwen2-rm"), "--policy",
            model_dir("tiny-qwen2-policy"), "--port", str(port), "--token-file", str(tmp_path / "token"),
            "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]
    log = open(tmp_path / "serve.log", "w")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                health = requests.get(f"{url}/health?token={TOKEN}", verify=str(cert), timeout=5)
                break
            except requests.exceptions.ConnectionError:
                time.sleep(0.5)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        with pytest.raises(requests.exceptions.ConnectionError):  # no plain HTTP on that port
            requests.get(f"http://127.0.0.1:{port}/health?token={TOKEN}", timeout=5)
    finally:
        process.terminate()
        process.wait(60)
        log.close()
    assert f"at https://127.0.0.1:{port}/get_reward" in (tmp_path / "serve.log").read_text()
