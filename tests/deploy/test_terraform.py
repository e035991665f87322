"""terraform/, checked without terraform (no binary here, and no AWS account): every .tf file
parses; variables and locals are declared where used and used where declared; every file a
`file()` or `templatefile()` names exists; the systemd unit passes `systemd-analyze verify`;
the cloud-init template, rendered as Terraform would with stand-in values, is a #cloud-config
YAML document that writes the unit and the config and starts the node; its install script
refuses a binary whose SHA-256 differs; and the silt.toml it writes is run by the real `silt
serve` until the unit's own health wait says ready.

Templates are rendered by a small renderer of the subset of Terraform's template language they
use (`${name}`, `${jsonencode(name)}`, `${indent(N, name)}`, `%{ if name }`/`else`/`endif`,
strip markers); anything else in a template fails the test, so a template never uses syntax
these checks would silently skip. Arguments come from the `local.*_vars` objects the
`templatefile()` calls name: literal locals and `file()` as Terraform evaluates them, the rest
(what AWS decides: bucket name, DNS name) from the stand-in values of each variant below."""

import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
import tomllib
from pathlib import Path

import hcl2
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TF = REPO / "terraform"
SILT_BIN = os.environ.get("SILT_BIN", "target/debug/silt")
# EC2 refuses user data larger than this (before base64).
USER_DATA_MAX = 16384

IDENT = r"[A-Za-z_][A-Za-z0-9_-]*"


# --- the module, parsed ---------------------------------------------------------------------

def parse_tf(text):
    return hcl2.loads(text)


@functools.cache
def module():
    """{file name: parsed .tf file}."""
    files = sorted(TF.glob("*.tf"))
    assert files, f"no .tf files in {TF}"
    return {p.name: parse_tf(p.read_text()) for p in files}


def unquote(label):
    return label[1:-1] if label.startswith('"') and label.endswith('"') else label


def strings(node):
    """Every string of a parsed tree (keys too), comments left out."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for k, v in node.items():
            if k.startswith("__"):
                continue
            yield k
            yield from strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from strings(v)


def declared_variables(parsed_files):
    return {unquote(label) for f in parsed_files for block in f.get("variable", []) for label in block
            if not label.startswith("__")}


def declared_locals(parsed_files):
    out = {}
    for f in parsed_files:
        for block in f.get("locals", []):
            for k, v in block.items():
                if not k.startswith("__"):
                    assert k not in out, f"local.{k} is declared twice"
                    out[k] = v
    return out


def references(parsed_files, kind, skip_blocks=()):
    """Names X of every `kind.X` (var, local) in the expressions of the files."""
    found = set()
    for f in parsed_files:
        for block_type, blocks in f.items():
            if block_type in skip_blocks or block_type.startswith("__"):
                continue
            for s in strings(blocks):
                found.update(re.findall(rf"(?<![\w.]){kind}\.({IDENT})", s))
    return found


def function_calls(parsed_files, name):
    """The argument text of every `name(...)` call: up to its first closing parenthesis."""
    return [m.group(1) for f in parsed_files for s in strings(f)
            for m in re.finditer(rf"(?<![\w.]){name}\(([^)]*)\)", s)]


def module_path(arg_text, call):
    m = re.match(r'\s*"\$\{path\.module\}/([^"$]+)"', arg_text)
    assert m, f'{call}({arg_text}): name the file as "${{path.module}}/NAME", so it does not depend on the cwd'
    return m.group(1)


def templatefile_calls(parsed_files):
    """(template file name, name of the local holding its arguments) of every templatefile()."""
    calls = []
    for args in function_calls(parsed_files, "templatefile"):
        path = module_path(args, "templatefile")
        m = re.fullmatch(r'\s*"[^"]*"\s*,\s*local\.(' + IDENT + r')\s*', args)
        assert m, f"templatefile({args}): pass the arguments as a local object (local.NAME) so they can be checked"
        calls.append((path, m.group(1)))
    return calls


# --- Terraform's template language, the subset the templates use ----------------------------

class TemplateError(AssertionError):
    pass


def tokens(text):
    """Literal strings and ("${", expr) / ("%{", directive) pairs, strip markers applied."""
    out, i, lit = [], 0, []
    while i < len(text):
        if text.startswith("$${", i) or text.startswith("%%{", i):
            lit.append(text[i + 1:i + 3])
            i += 3
            continue
        if text.startswith("${", i) or text.startswith("%{", i):
            end = text.find("}", i)
            if end < 0:
                raise TemplateError(f"unclosed {text[i:i + 2]} at offset {i}")
            body = text[i + 2:end]
            if "{" in body:
                raise TemplateError(f"nested braces are not supported here: {text[i:end + 1]!r}")
            strip_left, strip_right = body.startswith("~"), body.endswith("~")
            body = body.strip("~").strip()
            out.append("".join(lit))
            lit = []
            out.append((text[i:i + 2], body, strip_left, strip_right))
            i = end + 1
            continue
        lit.append(text[i])
        i += 1
    out.append("".join(lit))
    # A strip marker eats every whitespace character of the literal beside it (newlines too).
    for n, t in enumerate(out):
        if isinstance(t, tuple):
            if t[2]:
                out[n - 1] = out[n - 1].rstrip()
            if t[3]:
                out[n + 1] = out[n + 1].lstrip()
    return [t[:2] if isinstance(t, tuple) else t for t in out]


def go_json(value):
    # Terraform's jsonencode escapes like Go's encoding/json.
    s = json.dumps(value, ensure_ascii=False)
    for c, e in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        s = s.replace(c, e)
    return s


def as_text(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, str)):
        return str(value)
    raise TemplateError(f"cannot interpolate {value!r}")


def evaluate(expr, args):
    def arg(name):
        if name not in args:
            raise TemplateError(f"${{{expr}}}: {name} is not an argument of the template (it sees only those)")
        return args[name]

    if m := re.fullmatch(IDENT, expr):
        return as_text(arg(m.group(0)))
    if m := re.fullmatch(rf"jsonencode\(\s*({IDENT})\s*\)", expr):
        return go_json(arg(m.group(1)))
    if m := re.fullmatch(rf"indent\(\s*(\d+)\s*,\s*({IDENT})\s*\)", expr):
        # Terraform's indent: spaces after every newline, the first line left as it is.
        return as_text(arg(m.group(2))).replace("\n", "\n" + " " * int(m.group(1)))
    raise TemplateError(f"${{{expr}}}: not in the subset these tests render; extend tests/deploy")


def template_names(text):
    """Every argument name a template refers to, in any branch."""
    names = set()
    for t in tokens(text):
        if isinstance(t, tuple):
            kind, body = t
            if kind == "%{":
                body = re.sub(r"^if\s+", "", body)
                if body in ("else", "endif"):
                    continue
            names.update(n for n in re.findall(IDENT, re.sub(r"^(jsonencode|indent)\(", "", body)))
    return names


def render(text, args):
    out, stack = [], []  # stack: (condition, in else branch)
    for t in tokens(text):
        active = all(cond != in_else for cond, in_else in stack)
        if isinstance(t, str):
            if active:
                out.append(t)
            continue
        kind, body = t
        if kind == "${":
            value = evaluate(body, args)
            if active:
                out.append(value)
        elif m := re.fullmatch(rf"if\s+({IDENT})", body):
            cond = args.get(m.group(1))
            if not isinstance(cond, bool):
                raise TemplateError(f"%{{ {body} }}: {m.group(1)} must be a boolean argument, not {cond!r}")
            stack.append((cond, False))
        elif body == "else":
            if not stack:
                raise TemplateError("%{ else } without %{ if }")
            stack[-1] = (stack[-1][0], True)
        elif body == "endif":
            if not stack:
                raise TemplateError("%{ endif } without %{ if }")
            stack.pop()
        else:
            raise TemplateError(f"%{{ {body} }}: not in the subset these tests render; extend tests/deploy")
    if stack:
        raise TemplateError("%{ if } without %{ endif }")
    return "".join(out)


# --- rendering the module's templates ---------------------------------------------------------

def literal(value):
    """A parsed HCL value that is a literal (number, bool, quoted string without interpolation)."""
    if isinstance(value, (bool, int)):
        return True, value
    if isinstance(value, str) and value.startswith('"') and value.endswith('"') and "${" not in value:
        return True, json.loads(value)
    return False, None


def resolve(name, expr, variant, locals_):
    """A template argument's value: evaluated where Terraform's answer is known here, else the
    variant's stand-in for it."""
    if isinstance(expr, str):
        if m := re.fullmatch(rf"\$\{{local\.({IDENT}(?:\.{IDENT})*)\}}", expr):
            head, *rest = m.group(1).split(".")
            value = locals_[head]
            if not rest and isinstance(value, str) and value.startswith("${templatefile("):
                [(path, args_local)] = templatefile_calls([{"locals": [{head: value}]}])
                return render_template(path, args_local, variant)
            for part in rest:
                value = value[part] if isinstance(value, dict) else None
            ok, v = literal(value)
            if ok:
                return v
        elif m := re.fullmatch(r'\$\{file\((.*)\)\}', expr):
            return (TF / module_path(m.group(1), "file")).read_text()
    if name not in variant:
        raise AssertionError(f"no stand-in value for template argument {name} = {expr}: add one to the variants")
    return variant[name]


def render_template(path, args_local, variant):
    locals_ = declared_locals(module().values())
    args = {k: resolve(k, v, variant, locals_) for k, v in locals_[args_local].items() if not k.startswith("__")}
    return render((TF / path).read_text(), args)


def user_data(variant):
    [call] = [c for c in templatefile_calls(module().values()) if c[0].startswith("cloud-init")]
    return render_template(*call, variant)


def tls_pem(tmp):
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=silt.example.com"],
                   check=True, capture_output=True)
    return cert.read_text(), key.read_text()


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    """Stand-ins for what only AWS knows: the smallest deployment, and one with every option."""
    tmp = tmp_path_factory.mktemp("pem")
    if shutil.which("openssl"):
        cert, key = tls_pem(tmp)
    else:
        cert, key = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n", \
            "-----BEGIN PRIVATE KEY-----\nMIGH\n-----END PRIVATE KEY-----\n"
    if os.access(SILT_BIN, os.X_OK):
        passwd = tmp / "passwd"
        subprocess.run([SILT_BIN, "passwd", passwd, "alice"], input="wonderland\n", text=True, check=True,
                       capture_output=True)
        passwd = passwd.read_text()
    else:
        passwd = "alice:$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA\n"
    minimal = dict(
        region="eu-west-1",
        silt_download_url="https://downloads.example.com/silt/v0.1.0/silt-x86_64-linux",
        silt_sha256="0" * 64,
        kafka_advertised="ec2-203-0-113-10.eu-west-1.compute.amazonaws.com:9092",
        admin_host="127.0.0.1",
        object_store="s3://silt-20250101000000000000000001/silt",
        allow_anonymous="loopback",
        extra_config="",
        mqtt_tls=False, mqtt_tls_cert_pem="", mqtt_tls_key_pem="",
        password_file=False, password_file_content="",
        admin_token_file=False, admin_token="",
    )
    everything = dict(
        minimal,
        kafka_advertised="broker.example.com:9092",
        admin_host="0.0.0.0",
        object_store="s3://my-bucket/prod/silt",
        allow_anonymous="never",
        extra_config='[topic_defaults]\nretention_ms = 604800000\n\n[[topics]]\nmatch = "debug/#"\ntier = "local"\n',
        mqtt_tls=True, mqtt_tls_cert_pem=cert, mqtt_tls_key_pem=key,
        password_file=True, password_file_content=passwd,
        admin_token_file=True, admin_token="Zx8kQ2mP7vR4tY1wE6uI9oA3sD5fG0hJ2kL4zX6c",
    )
    return {"minimal": minimal, "everything": everything}


VARIANTS = ["minimal", "everything"]


def cloud_config(text):
    doc = yaml.safe_load(text)
    assert isinstance(doc, dict), text
    return doc


def written(doc):
    return {f["path"]: f for f in doc.get("write_files", [])}


def unit_settings(text):
    settings = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            k, v = line.split("=", 1)
            settings.setdefault(k.strip(), []).append(v.strip())
    return settings


# --- the .tf files ---------------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted(p.name for p in TF.glob("*.tf")))
def test_every_tf_file_parses(path):
    assert parse_tf((TF / path).read_text())


def test_every_variable_used_is_declared_and_every_declared_one_is_used():
    files = list(module().values())
    declared = declared_variables(files)
    assert declared, "no variable blocks found"
    undeclared = references(files, "var") - declared
    assert not undeclared, f"used but not declared as a variable: {sorted(undeclared)}"
    # A variable's own validation block does not count as a use.
    unused = declared - references(files, "var", skip_blocks=("variable",))
    assert not unused, f"declared but never used: {sorted(unused)}"


def test_every_local_used_is_declared_and_every_declared_one_is_used():
    files = list(module().values())
    declared = set(declared_locals(files))
    used = references(files, "local")
    assert not used - declared, f"used but not declared in a locals block: {sorted(used - declared)}"
    assert not declared - used, f"declared but never used: {sorted(declared - used)}"


def test_the_checks_catch_an_undeclared_and_an_unused_variable():
    """The reference scan itself: a typo and a leftover are found, comments and validations
    are not taken for uses."""
    files = [parse_tf('variable "region" {\n  type = string\n}\n'
                      'variable "leftover" {\n  type = string\n'
                      '  validation {\n    condition = var.leftover != ""\n    error_message = "x"\n  }\n}\n'
                      '# var.leftover in a comment is no use\n'
                      'provider "aws" {\n  region = var.regoin\n}\n')]
    assert references(files, "var") - declared_variables(files) == {"regoin"}
    assert declared_variables(files) - references(files, "var", skip_blocks=("variable",)) == {"leftover", "region"}


def test_no_conditional_chooses_between_an_object_and_an_empty_one():
    """`c ? { a = 1 } : {}` passes this parser but not `terraform validate` (the branches'
    types must unify; an object with attributes and an empty one do not)."""
    bad = re.compile(r"\?\s*\{.*?\S.*?\}\s*:\s*\{\s*\}|\?\s*\{\s*\}\s*:\s*\{\s*[^{}\s]")
    assert all(bad.search(e) for e in ("${c ? {a = 1} : {}}", "${c ? {} : {a = 1}}",
                                       "${merge(x, c ? {tls = {port = 8883}} : {})}"))
    found = [s for f in module().values() for s in strings(f) if bad.search(s)]
    assert not found, f"use a for expression with an if filter instead: {found}"


def test_every_file_and_template_named_exists():
    files = list(module().values())
    named = [module_path(a, "file") for a in function_calls(files, "file")]
    named += [path for path, _ in templatefile_calls(files)]
    assert named, "no file() or templatefile() calls found"
    missing = [n for n in named if not (TF / n).is_file()]
    assert not missing, f"named but missing in terraform/: {missing}"


def test_each_template_gets_exactly_the_arguments_it_uses():
    files = list(module().values())
    locals_ = declared_locals(files)
    calls = templatefile_calls(files)
    assert {p for p, _ in calls} == {"cloud-init.yaml.tftpl", "silt.toml.tftpl"}, calls
    for path, args_local in calls:
        args = locals_[args_local]
        assert isinstance(args, dict), f"local.{args_local} must be an object literal"
        given = {k for k in args if not k.startswith("__")}
        used = template_names((TF / path).read_text())
        assert not used - given, f"{path} uses {sorted(used - given)}, not in local.{args_local}"
        assert not given - used, f"local.{args_local} passes {sorted(given - used)}, unused by {path}"


def test_the_admin_listener_is_closed_unless_asked_for():
    variables = {unquote(k): v for f in module().values() for b in f.get("variable", []) for k, v in b.items()}
    assert variables["admin_cidrs"]["default"] == [], "the admin listener is closed unless asked for"
    for name in ("mqtt_cidrs", "mqtt_tls_cidrs", "kafka_cidrs", "ssh_cidrs"):
        assert name in variables, f"each listener has its own CIDR list: {name} missing"


def test_the_tfvars_example_sets_only_declared_variables_and_every_required_one():
    example = parse_tf((TF / "terraform.tfvars.example").read_text())
    files = list(module().values())
    set_ = {k for k in example if not k.startswith("__")}
    assert not set_ - declared_variables(files), sorted(set_ - declared_variables(files))
    required = {unquote(k) for f in files for b in f.get("variable", []) for k, v in b.items()
                if not k.startswith("__") and "default" not in v}
    assert required <= set_, f"required but not in the example: {sorted(required - set_)}"


# --- the systemd unit --------------------------------------------------------------------------

def test_the_unit_passes_systemd_analyze_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (package systemd): the unit is not verified")
    text = (TF / "silt.service").read_text()
    settings = unit_settings(text)
    [exec_start] = settings["ExecStart"]
    binary = shlex.split(exec_start)[0]
    # verify needs every Exec binary to exist; Silt's is installed by cloud-init, not here.
    unit = tmp_path / "silt.service"
    unit.write_text(text.replace(f"ExecStart={binary} ", "ExecStart=/bin/true "))
    p = subprocess.run([analyze, "verify", unit], capture_output=True, text=True, timeout=120)
    # An unknown key or a bad value is only a warning (exit 0): any word about the unit fails.
    about_unit = [line for line in (p.stdout + p.stderr).splitlines() if "silt.service" in line]
    assert p.returncode == 0 and not about_unit, p.stdout + p.stderr


def test_the_unit_restarts_always_and_waits_for_readyz():
    settings = unit_settings((TF / "silt.service").read_text())
    assert settings["Restart"] == ["always"]
    assert settings["LimitNOFILE"] == ["1048576"]
    assert settings["User"] == ["silt"] and settings["StateDirectory"] == ["silt"]
    for hardening in ("NoNewPrivileges", "PrivateTmp"):
        assert settings[hardening] == ["yes"], hardening
    assert settings["ProtectSystem"] == ["strict"]
    [post] = settings["ExecStartPost"]
    admin_port = declared_locals(module().values())["ports"]["admin"]
    assert f"http://127.0.0.1:{admin_port}/readyz" in post, post
    assert "--retry-max-time" in post, "the health wait must give up at some point"


# --- cloud-init --------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
def test_cloud_init_is_a_cloud_config_that_writes_the_unit_and_config_and_starts_silt(variants, variant):
    text = user_data(variants[variant])
    assert text.splitlines()[0] == "#cloud-config", text[:200]
    assert len(text.encode()) < USER_DATA_MAX, f"user data is {len(text.encode())} bytes, EC2 takes {USER_DATA_MAX}"
    doc = cloud_config(text)
    files = written(doc)
    unit_text = (TF / "silt.service").read_text()
    unit = unit_settings(unit_text)

    # Byte for byte what the files hold: the indentation survived. (YAML's `|` keeps one final
    # newline of a block, whatever the template ended with.)
    assert files["/etc/systemd/system/silt.service"]["content"] == unit_text
    [toml_call] = [c for c in templatefile_calls(module().values()) if c[0] == "silt.toml.tftpl"]
    exec_start = shlex.split(unit["ExecStart"][0])
    config_path = exec_start[exec_start.index("--config") + 1]
    assert files[config_path]["content"] == render_template(*toml_call, variants[variant]).rstrip("\n") + "\n"
    [env_file] = unit["EnvironmentFile"]
    assert f"AWS_REGION={variants[variant]['region']}" in files[env_file]["content"].splitlines()

    # The binary the unit runs is the one the install script puts in place.
    install = files["/usr/local/sbin/silt-install"]
    assert install["permissions"] == "0755"
    assert f" {exec_start[0]}\n" in install["content"], install["content"]
    steps = " ; ".join(" ".join(s) if isinstance(s, list) else s for s in doc["runcmd"])
    assert "/usr/local/sbin/silt-install &&" in steps and "systemctl enable --now silt.service" in steps, steps
    # curl: the download and the unit's health wait.
    assert "curl" in doc["packages"]
    assert any(isinstance(u, dict) and u["name"] == unit["User"][0] and u.get("system") for u in doc["users"])

    # Every file silt.toml names is written; the group-owned ones after the users exist.
    config = tomllib.loads(files[config_path]["content"])
    named = [config["mqtt"].get("tls", {}).get(k) for k in ("cert_file", "key_file")]
    named.append(config["mqtt"]["auth"].get("password_file"))
    for path in filter(None, named):
        assert path in files, f"silt.toml names {path}, which cloud-init does not write"
        assert files[path]["content"].strip(), path
        if ":silt" in files[path]["owner"]:
            assert files[path].get("defer") is True, f"{path}: the silt group exists only after write_files runs"
    assert bool(named[0]) == variants[variant]["mqtt_tls"]
    assert bool(named[2]) == variants[variant]["password_file"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_silt_toml_uses_only_known_keys_and_the_unit_s_data_directory(variants, variant):
    files = written(cloud_config(user_data(variants[variant])))
    config = tomllib.loads(files["/etc/silt/silt.toml"]["content"])
    # Silt binds loopback by default: a deployed node must bind every address.
    assert config["mqtt"]["listen"].startswith("0.0.0.0:")
    assert config["kafka"]["listen"].startswith("0.0.0.0:")
    assert config["kafka"]["advertised"] == variants[variant]["kafka_advertised"]
    assert config["tiering"]["object_store"] == variants[variant]["object_store"]
    [state] = unit_settings((TF / "silt.service").read_text())["StateDirectory"]
    assert config["data_dir"] == f"/var/lib/{state}"

    # Every key is one config/silt.toml documents (commented-out ones included); the real
    # binary's check, stricter, is the next test.
    known, table = set(), ""
    for line in (REPO / "config" / "silt.toml").read_text().splitlines():
        if m := re.match(r"#?\s*\[\[?([\w.]+)\]\]?\s*$", line):
            table = m.group(1)
        elif m := re.match(r"#?\s*(\w+)\s*=", line):
            known.add(f"{table}.{m.group(1)}" if table else m.group(1))

    def keys(node, prefix=""):
        for k, v in node.items():
            path = f"{prefix}{k}"
            if isinstance(v, dict):
                yield from keys(v, path + ".")
            elif isinstance(v, list) and v and isinstance(v[0], dict):
                for item in v:
                    yield from keys(item, path + ".")
            else:
                yield path

    unknown = set(keys(config)) - known
    assert not unknown, f"keys config/silt.toml does not know: {sorted(unknown)}"


@pytest.mark.parametrize("good", [True, False], ids=["matching-sha256", "other-sha256"])
def test_the_install_script_installs_only_a_binary_with_the_expected_sha256(variants, tmp_path, good):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed: the install script cannot be run")
    release = tmp_path / "silt-release"
    release.write_bytes(b"#!/bin/sh\necho silt\n")
    digest = hashlib.sha256(release.read_bytes()).hexdigest()
    variant = dict(variants["minimal"], silt_download_url=release.as_uri(),
                   silt_sha256=digest if good else hashlib.sha256(b"something else").hexdigest())
    script = written(cloud_config(user_data(variant)))["/usr/local/sbin/silt-install"]["content"]
    target = tmp_path / "bin" / "silt"
    target.parent.mkdir()
    assert script.count(" /usr/local/bin/silt\n") == 1, script
    local_script = tmp_path / "silt-install"
    local_script.write_text(script.replace(" /usr/local/bin/silt\n", f" {target}\n"))
    p = subprocess.run(["sh", local_script], capture_output=True, text=True, timeout=60)
    if good:
        assert p.returncode == 0, p.stderr
        assert target.read_bytes() == release.read_bytes() and os.access(target, os.X_OK)
    else:
        assert p.returncode != 0 and not target.exists(), (p.returncode, p.stderr)


# --- the real binary -----------------------------------------------------------------------------

class Node:
    """`silt serve` on the rendered config, its listeners moved to free loopback ports."""

    def __init__(self, config, data_dir, tls):
        (data_dir.parent / "objects").mkdir()
        args = [SILT_BIN, "serve", "--config", config, "--data-dir", data_dir,
                "--mqtt", "127.0.0.1:0", "--kafka", "127.0.0.1:0", "--admin", "127.0.0.1:0",
                "--object-store", (data_dir.parent / "objects").as_uri()]
        if tls:
            args += ["--mqtt-tls", "127.0.0.1:0"]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.log = []
        self.admin = threading.Event()

        def pump():
            for line in self.proc.stderr:
                self.log.append(line)
                if m := re.search(r"admin listener bound addr=(127\.0\.0\.1:\d+)", line):
                    self.admin_addr = m.group(1)
                    self.admin.set()

        threading.Thread(target=pump, daemon=True).start()

    def text(self):
        return "".join(self.log)


@pytest.mark.parametrize("variant", VARIANTS)
def test_silt_serves_the_written_config_until_the_unit_s_health_wait_says_ready(variants, variant, tmp_path):
    if not os.access(SILT_BIN, os.X_OK):
        pytest.skip(f"no silt binary at {SILT_BIN} (set SILT_BIN): the config is not run")
    files = written(cloud_config(user_data(variants[variant])))
    # cloud-init's files, under tmp_path instead of /: silt.toml's paths follow them there.
    root = tmp_path / "root"
    for path, f in files.items():
        if path.startswith("/etc/silt/"):
            dest = root / path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(f["content"].replace("/etc/silt/", f"{root}/etc/silt/"))
    config = root / "etc/silt/silt.toml"
    assert tomllib.loads(config.read_text())  # still TOML after the move
    node = Node(config, tmp_path / "data", tls=variants[variant]["mqtt_tls"])
    try:
        deadline = time.monotonic() + 60
        while not node.admin.wait(0.2):
            assert node.proc.poll() is None, f"silt exited ({node.proc.returncode}):\n{node.text()}"
            assert time.monotonic() < deadline, f"silt did not bind its admin listener:\n{node.text()}"
        [post] = unit_settings((TF / "silt.service").read_text())["ExecStartPost"]
        admin_port = declared_locals(module().values())["ports"]["admin"]
        # The unit's own health wait, pointed at this node ($$ is systemd's escaped $).
        wait = [a.replace("$$", "$").replace(f"127.0.0.1:{admin_port}", node.admin_addr) for a in shlex.split(post)]
        started = time.monotonic()
        p = subprocess.run(wait, capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, f"health wait: {p.returncode} {p.stderr}\n{node.text()}"
        assert time.monotonic() - started < 120
        # Logged just before the node says ready; the thread reading its stderr may not have
        # got to the line yet when the health wait returns (seen with both cores busy).
        logged = time.monotonic() + 10
        while "silt is running" not in node.text():
            assert time.monotonic() < logged, node.text()
            time.sleep(0.05)
        if variants[variant]["mqtt_tls"]:
            assert "mqtt listener bound kind=tls" in node.text(), node.text()
    finally:
        if node.proc.poll() is None:
            node.proc.send_signal(signal.SIGTERM)
        try:
            code = node.proc.wait(60)
        except subprocess.TimeoutExpired:
            node.proc.kill()
            node.proc.wait(30)
            raise
    assert code == 0, node.text()
