"""envs/install.py, the Makefile's set-up: uv installs the requirements from where pip would take
them (pip's settings passed on), and pip installs them where uv cannot.

The installers are stand-ins here (a `python` and a `uv` that record their arguments in a fake
environment), so what is checked is what the set-up asks of them, in order; the real install
runs in CI's `make test` on a fresh machine."""
import importlib.util
import shlex
import stat
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("envs_install", REPO / "envs" / "install.py")
install = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install)

# `pip config list` as this project's machines print it: a local wheel directory from the
# environment and from /etc/pip.conf, two local indexes, a constraints file
CONFIG_LIST = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/other.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/elsewhere'
install.find-links='/also-elsewhere'
install.no-index='false'
"""


def test_pip_settings_take_the_environment_over_install_over_global():
    got = install.pip_settings(CONFIG_LIST)
    assert got["find-links"] == "/opt/wheels"  # :env: wins over install. and global.
    assert got["cert"] == "/etc/ssl/certs/ca-certificates.crt"
    assert got["extra-index-url"] == "file:///opt/pypi/simple file:///opt/pypi-more/simple"
    assert got["constraint"] == "/etc/xdg/pip/constraints.txt"
    without_env = install.pip_settings("\n".join(line for line in CONFIG_LIST.splitlines() if not line.startswith(":env:")))
    assert without_env["find-links"] == "/also-elsewhere"  # install. wins over global.


def test_uv_gets_every_index_link_and_constraint_and_searches_them_all_as_pip_does():
    opts, env = install.uv_options(install.pip_settings(CONFIG_LIST))
    pairs = list(zip(opts[::2], opts[1::2]))
    assert ("--index-strategy", "unsafe-best-match") in pairs
    assert [v for f, v in pairs if f == "--extra-index-url"] == ["file:///opt/pypi/simple", "file:///opt/pypi-more/simple"]
    assert [v for f, v in pairs if f == "--find-links"] == ["/opt/wheels"]
    assert [v for f, v in pairs if f == "--constraint"] == ["/etc/xdg/pip/constraints.txt"]
    assert "--no-index" not in opts and "--index-url" not in opts
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"}
    opts, env = install.uv_options(install.pip_settings("global.no-index='true'\nglobal.index-url='https://m/simple'"))
    assert opts[-3:] == ["--index-url", "https://m/simple", "--no-index"] and env == {}


def fake_env(tmp_path: Path, uv_installs: bool, uv_works: bool) -> Path:
    """A virtual environment whose `python` and `uv` append their arguments to calls.txt:
    `python -m pip config list` prints CONFIG_LIST, `python -m pip install uv==...` fails unless
    `uv_installs`, and `uv` fails unless `uv_works`."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "calls.txt"
    listing = tmp_path / "config-list.txt"
    listing.write_text(CONFIG_LIST)
    scripts = {
        "python": f"""#!/bin/sh
echo "python $*" >> {shlex.quote(str(log))}
case "$*" in
  "-m pip config list") cat {shlex.quote(str(listing))} ;;
  *"install --quiet uv=="*) exit {0 if uv_installs else 1} ;;
esac
""",
        "uv": f"""#!/bin/sh
echo "uv $* SSL_CERT_FILE=$SSL_CERT_FILE" >> {shlex.quote(str(log))}
exit {0 if uv_works else 1}
""",
    }
    for name, text in scripts.items():
        path = venv / "bin" / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return venv


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls.txt").read_text().splitlines()


def test_uv_installs_the_three_parts_in_order_from_pips_sources(tmp_path, capsys):
    venv = fake_env(tmp_path, uv_installs=True, uv_works=True)
    assert install.main([str(venv)]) == 0
    uv = [c for c in calls(tmp_path) if c.startswith("uv ")]
    assert len(uv) == 3
    for call, args in zip(uv, install.INSTALLS):
        assert call.startswith(f"uv pip install --quiet --python {venv.absolute()}/bin/python ")
        assert f"{' '.join(args)} SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt" in call
        assert "--find-links /opt/wheels" in call and "--extra-index-url file:///opt/pypi-more/simple" in call
    assert [c.split()[-2] for c in uv] == ["requirements.txt", "requirements-data.txt", "."]
    assert "--no-deps" not in uv[0] and "--no-deps -r requirements-data.txt" in uv[1] and "--no-deps -e ." in uv[2]
    assert not any("pip install --quiet --no-compile" in c for c in calls(tmp_path))  # pip installed uv only


@pytest.mark.parametrize("uv_installs", [False, True])
def test_pip_installs_everything_where_uv_cannot(tmp_path, capsys, uv_installs):
    venv = fake_env(tmp_path, uv_installs=uv_installs, uv_works=False)
    assert install.main([str(venv)]) == 0
    assert "installing them with pip" in capsys.readouterr().out
    pip = [c for c in calls(tmp_path) if c.startswith("python -m pip install --quiet") and "uv==" not in c]
    assert pip == ["python -m pip install --quiet --upgrade pip",
                   "python -m pip install --quiet --no-compile -r requirements.txt",
                   "python -m pip install --quiet --no-compile --no-deps -r requirements-data.txt",
                   "python -m pip install --quiet --no-compile --no-deps -e ."]
    assert sum(c.startswith("uv ") for c in calls(tmp_path)) == (1 if uv_installs else 0)


def test_a_missing_environment_is_named(tmp_path):
    with pytest.raises(SystemExit, match=f"{tmp_path}/nowhere/bin/python not found"):
        install.main([str(tmp_path / "nowhere")])


def test_the_makefile_sets_up_with_this_script():
    makefile = (REPO / "Makefile").read_text()
    assert "$(BIN)/python envs/install.py $(VENV)" in makefile
    assert "envs/install.py" in makefile.split("$(VENV)/.installed:", 1)[1].splitlines()[0]  # a prerequisite


def test_the_extras_are_installed_alone_and_held_to_the_main_pins(tmp_path, capsys):
    """`--extras` installs requirements-extras.txt only, constrained by requirements.txt, so that no
    extra moves a pin the main job was tested with."""
    venv = fake_env(tmp_path, uv_installs=True, uv_works=True)
    assert install.main([str(venv)]) == 0
    before = len(calls(tmp_path))
    assert install.main(["--extras", str(venv)]) == 0
    new = calls(tmp_path)[before:]
    uv = [c for c in new if c.startswith("uv ")]
    assert len(uv) == 1 and "-c requirements.txt -r requirements-extras.txt" in uv[0]
