"""`python -m fedskew new method|dataset|partition NAME`: a new method, dataset source or partition scheme as a
package of its own, ready to install (`new method NAME --kind server`: a method whose own part is its server
update).

It writes a working plugin (fedskew.plugins) into a new folder: the piece (a method is FedAvg, a source generates
Gaussian blobs, a scheme draws as iid, until the researcher changes it), its pyproject.toml with the entry point
fedskew finds it by, a test, an experiment using it (a method beside FedAvg, a scheme beside iid, a source under
FedAvg and FedProx), and a README. The files come from the
templates in src/fedskew/templates/<kind>/, plain text in which `{name}`, `{Class}` and `{distribution}` are
replaced.

Either every file is written or none: they are written into a temporary folder beside the target, which is
then renamed to it, and a problem found beforehand (a bad name, a folder in the way) writes nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import keyword
import os
import re
import shutil
import tempfile
from pathlib import Path

from fedskew.config_errors import ConfigError

KINDS = ("method", "dataset", "partition")

# The files of a new method, relative to its folder -> the template each is made from.
METHOD_FILES = {
    "pyproject.toml": "pyproject.toml.tmpl",
    "{name}/__init__.py": "__init__.py.tmpl",
    "{name}/method.py": "method.py.tmpl",
    "tests/test_{name}.py": "test.py.tmpl",
    "experiments/{name}.yaml": "experiment.yaml.tmpl",
    "README.md": "README.md.tmpl",
}

# The files of a new partition scheme, likewise.
PARTITION_FILES = {
    "pyproject.toml": "pyproject.toml.tmpl",
    "{name}/__init__.py": "__init__.py.tmpl",
    "{name}/scheme.py": "scheme.py.tmpl",
    "tests/test_{name}.py": "test.py.tmpl",
    "experiments/{name}.yaml": "experiment.yaml.tmpl",
    "README.md": "README.md.tmpl",
}

# The files of a new dataset source, likewise.
DATASET_FILES = {
    "pyproject.toml": "pyproject.toml.tmpl",
    "{name}/__init__.py": "__init__.py.tmpl",
    "{name}/source.py": "source.py.tmpl",
    "tests/test_{name}.py": "test.py.tmpl",
    "experiments/{name}.yaml": "experiment.yaml.tmpl",
    "README.md": "README.md.tmpl",
}

FILES = {"method": METHOD_FILES, "dataset": DATASET_FILES, "partition": PARTITION_FILES}

# What a new method's own part is (`new method NAME --kind ...`): its clients' objective (a loss: FedAvg whose
# `local_loss` is there to change), or its server update (a Fold and a state kept across rounds, in checkpoints).
# A server method's package is a method's, but for these files, which come from templates/server/.
METHOD_KINDS = ("loss", "server")
SERVER_TEMPLATES = ("method.py.tmpl", "test.py.tmpl", "README.md.tmpl")

# A Python package name that params.yaml can also use as an id (which must start with a letter or digit).
NAME = re.compile(r"[a-z][a-z0-9_]*")


def class_name(name: str) -> str:
    """The class of method `name`: my_method -> MyMethod."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def placeholders(name: str) -> dict[str, str]:
    """What each placeholder of the templates becomes for method `name`."""
    return {"{name}": name, "{Class}": class_name(name), "{distribution}": f"fedskew-{name.replace('_', '-')}"}


def check_name(name: str, kind: str = "method") -> None:
    """Refuse a name that cannot be both the piece's id and its package's name, or that is taken."""
    if not NAME.fullmatch(name) or keyword.iskeyword(name):
        raise ConfigError(f"{name!r} cannot name a {kind} package: use lower-case letters, digits and _, starting "
                          "with a letter, and no Python keyword (e.g. fedfocal)")
    origin = _taken(kind, name)
    if origin:
        raise ConfigError(f"{name!r} is already {origin}; choose another name")
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.origin not in (None, "namespace"):  # a folder without __init__.py shadows nothing
        raise ConfigError(f"{name!r} is already an importable module ({spec.origin}), which the new package would "
                          "clash with; choose another name")


def _taken(kind: str, name: str) -> str | None:
    """What `name` already is among the pieces of `kind`, or None."""
    if kind == "dataset":
        from fedskew.catalog import sources

        known = sources().get(name)
        if known is None:
            return None
        return f"a dataset source of plugin {known.plugin}" if known.plugin else "a built-in dataset source"
    if kind == "partition":
        from fedskew.data.partitions.registry import BUILT_IN, PLUGINS

        if name in PLUGINS:
            return f"a partition scheme of plugin {PLUGINS[name].distribution}"
        return "a built-in partition scheme" if name in BUILT_IN else None
    from fedskew.catalog import methods

    known = methods().get(name)
    if known is None:
        return None
    origin = f"a plugin of {known['plugin']}" if "plugin" in known else "a built-in method"
    return f"{origin} (python -m fedskew methods lists them)"


def check_target(directory: Path) -> None:
    """Refuse a target that holds anything: the new files must not mix with (or replace) others."""
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"{directory} exists and is not a folder; give --dir a new or empty folder")
    if directory.is_dir() and any(directory.iterdir()):
        raise ConfigError(f"{directory} exists and is not empty; give --dir a new or empty folder")
    if directory.is_dir() and directory.samefile(Path.cwd()):  # the rename would replace the folder the shell is in
        raise ConfigError(f"{directory} is the current folder; give --dir a new folder inside it, e.g. ./<name>")


def rendered(kind: str, name: str, method_kind: str = "loss") -> dict[str, str]:
    """The new piece's files, relative path -> text, from the templates of `kind` (a server method's own from
    templates/server/)."""
    templates = Path(__file__).parent / "templates"
    values = placeholders(name)
    files = {}
    for target, template in FILES[kind].items():
        folder = "server" if method_kind == "server" and template in SERVER_TEMPLATES else kind
        text = (templates / folder / template).read_text(encoding="utf-8")
        for placeholder, value in values.items():
            text = text.replace(placeholder, value)
        files[target.replace("{name}", name)] = text
    return files


def create(kind: str, name: str, directory: Path, method_kind: str | None = None) -> list[str]:
    """Write the new piece `name` of `kind` into `directory` (new, or empty); the paths written, relative to it.
    `method_kind` (METHOD_KINDS, for a method only; default loss) is what the new method changes."""
    if kind not in KINDS:
        raise ConfigError(f"fedskew new {kind}: it writes a {' or a '.join(KINDS)} package only so far; choose "
                          "one of those kinds")
    if method_kind is not None and kind != "method":
        raise ConfigError(f"--kind {method_kind} is for a method (its loss or its server update); a {kind} "
                          "package has one form, so leave --kind out")
    if method_kind not in (None, *METHOD_KINDS):
        raise ConfigError(f"--kind {method_kind!r} is not a kind of method; choose {' or '.join(METHOD_KINDS)}")
    check_name(name, kind)
    directory = Path(os.path.abspath(directory))  # "." and "pkg/" name their folder, and have a parent
    check_target(directory)
    files = rendered(kind, name, method_kind or "loss")
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        # Beside the target, so that the rename stays on one file system and is atomic.
        scratch = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    except OSError as error:
        raise ConfigError(f"cannot write beside {directory}: {error.strerror}; give --dir a folder you can "
                          "write in") from error
    try:
        for relative, text in files.items():
            path = scratch / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        scratch.chmod(0o777 & ~_umask())  # from mkdtemp's 0700 to what mkdir would give
        scratch.rename(directory)  # replaces an empty folder; refused if something appeared in it meanwhile
    except BaseException as error:
        shutil.rmtree(scratch, ignore_errors=True)
        if isinstance(error, OSError):
            raise ConfigError(f"cannot write {directory}: {error.strerror}; nothing was written, run it again "
                              "with --dir a new folder") from error
        raise
    return list(files)


def _umask() -> int:
    """The process's umask (read by setting it, then set back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `new` command and its arguments, on the CLI's subcommands."""
    p = sub.add_parser("new", help="write a new method, dataset source or partition scheme as a plugin package, "
                                   "ready to pip install: the piece (FedAvg, Gaussian blobs or iid's draw, until "
                                   "changed), its entry point, a test, an experiment and a README")
    p.add_argument("kind", choices=KINDS, help="what to write: a method, a dataset source or a partition scheme")
    p.add_argument("name", help="the piece's name, also its package's: lower case, e.g. fedfocal")
    p.add_argument("--dir", type=Path, help="the folder to write, new or empty (default: ./NAME)")
    p.add_argument("--kind", dest="method_kind", choices=METHOD_KINDS,
                   help="a method's own part: loss (the default: its clients' objective, FedAvg until changed) or "
                        "server (a Fold with a state kept across rounds and checkpointed: server momentum, FedAvg "
                        "until changed)")


def cmd_new(params: object, args: argparse.Namespace) -> None:
    """`python -m fedskew new method|dataset|partition NAME`: write the package, then say what it holds and what
    comes next (no params.yaml is read: `params` is None)."""
    directory = args.dir if args.dir is not None else Path(args.name)
    written = create(args.kind, args.name, directory, args.method_kind)
    print(f"wrote {directory}/: {', '.join(written)}")
    experiment = directory / "experiments" / f"{args.name}.yaml"
    print("next, from your project's root:")
    for command in (f"pip install -e {directory}", f"mkdir -p experiments && cp {experiment} experiments/",
                    "python -m fedskew validate", f"snakemake --cores all results/tables/{args.name}.md"):
        print(f"  {command}")
