"""What the API schema cannot say by itself, for the schema run
(scripts/schemathesis): how to make a body of `application/x-tar`.

The schema declares tar bodies as `type: string, format: binary`; a tar is
bytes with a structure, so random bytes are not one. This strategy makes
real, small archives (a few regular files and directories with safe
relative names), so the positive cases are tars the import accepts.
"""

import io
import tarfile

import schemathesis
from hypothesis import strategies as st

NAMES = st.from_regex(r"\A[a-z][a-z0-9_.-]{0,15}\Z", fullmatch=True).filter(
    lambda n: n not in (".", "..") and not n.endswith(".")
)


@st.composite
def tars(draw):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for directory in draw(st.lists(NAMES, max_size=2, unique=True)):
            info = tarfile.TarInfo(f"d-{directory}")
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            archive.addfile(info)
        for name in draw(st.lists(NAMES, max_size=3, unique=True)):
            data = draw(st.binary(max_size=256))
            info = tarfile.TarInfo(f"f-{name}")
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


schemathesis.openapi.media_type("application/x-tar", tars())


# ---------------------------------------------------------------------------
# Rules between parameters that OpenAPI 3.0 cannot state (each is in the
# schema's descriptions and in docs/api.md). A "schema-valid request
# rejected" failure is dropped only when the request breaks one of these
# rules and the server's refusal says so; every other failure stands.

def _query(case):
    return case.query or {}


def _body(case):
    return case.body if isinstance(case.body, dict) else {}


def _flag(value):
    return str(value).lower() in ("true", "1")


def _names_over_64_bytes(case):
    values = [_body(case).get("name"), _query(case).get("name")]
    return any(isinstance(v, str) and len(v.encode()) > 64 for v in values)


def _env_name_refused(case):
    env = _body(case).get("env") or {}
    import re

    return any(
        not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,255}", k) or k == "DORMOUSE_EXEC" for k in env
    )


def _argv0_empty(case):
    argv = _body(case).get("argv")
    return isinstance(argv, list) and bool(argv) and argv[0] == ""


def _tar_form_mismatch(case):
    # The body is a tar exactly when `workspace_tar=true`; name and owner
    # in the query only then.
    tar = _flag(_query(case).get("workspace_tar", "false"))
    is_tar = (case.media_type or "").startswith("application/x-tar")
    named = "name" in _query(case) or "owner" in _query(case)
    return tar != is_tar or (named and not tar)


# (operation, the rule broken, the start of the server's refusal)
RULES = [
    ("GET /v1/computers/{id}/screenshot",
     lambda c: _flag(_query(c).get("last", "false")) and ("format" in _query(c) or "quality" in _query(c)),
     "the last screen comes as it was kept"),
    ("PUT /v1/computers/{id}/files/{path}",
     lambda c: _flag(_query(c).get("dir", "false")) and "mode" in _query(c),
     "mode applies to files, not to dir=true"),
    ("POST /v1/computers", _tar_form_mismatch, ""),
    ("POST /v1/computers", lambda c: bool(_body(c).get("workspace_from")), "no kept workspace of computer"),
    ("POST /v1/computers", _names_over_64_bytes, "name must be 1 to 64"),
    ("POST /v1/computers/{id}/exec", _argv0_empty, "argv[0] is empty"),
    ("POST /v1/computers/{id}/exec", _env_name_refused, ""),
    ("GET /v1/computers/{id}/exec/ws", lambda c: (_query(c).get("argv") or [None])[0] == "" if isinstance(_query(c).get("argv"), list) else _query(c).get("argv") == "", "argv[0] is empty"),
    ("GET /v1/computers/{id}/screenshot",
     lambda c: "quality" in _query(c) and _query(c).get("format", "png") not in ("jpeg", "webp"),
     "quality applies to jpeg and webp"),
    ("GET /v1/computers/{id}/exec/ws",
     lambda c: "generation" in _query(c) and "Dormouse-Generation" in (c.headers or {}),
     "the generation was given both as a header and as a query parameter"),
]


# Refusals that stand for any case of the operation, because what they
# check is not in the schema: what a desktop holds (a working directory or
# a program that is not there, as an unknown id is not), the screen's size
# that bounds a batch's coordinates, the X keysym table that key names come
# from, sums and counts across a batch's actions (its description says
# them), the order of a region's corners (x0 < x1, y0 < y1), and a quality
# only with format jpeg or webp (png is the default).
_EXEC_REFUSALS = ('"message":"bad_cwd:', '"message":"not_found:', '"message":"not_executable:')
ANY_CASE = {
    "POST /v1/computers/{id}/exec": _EXEC_REFUSALS,
    "GET /v1/computers/{id}/exec/ws": _EXEC_REFUSALS,
    "POST /v1/computers/{id}/actions": (
        "space\"}}",
        "the durations of the batch add up to",
        "the texts of the batch add up to",
        "a batch takes at most",
        "a batch reads the clipboard at most",
        ": region: region [",
        ": unknown key ",
        "quality applies to jpeg and webp",
    ),
}


@schemathesis.hook
def filter_failure(ctx, failure, case, response):
    if failure.code != "ST202" or response.status_code != 400:
        return True
    text = response.text or ""
    label = case.operation.label
    if any(refusal in text for refusal in ANY_CASE.get(label, ())):
        return False
    for operation, broken, refusal in RULES:
        if label == operation and broken(case) and refusal in text:
            return False
    return True
