"""Every YAML file a researcher writes, read strictly: params.yaml, the experiments and the claims files.

A file the user writes is data, read the same way wherever it enters, each refusal one line naming the file, the
line and the key path where there is one:

- only a regular file is read: a folder, a device, a named pipe or a socket is refused from its metadata, never
  opened; a link is followed only when its target lies inside the project (a link to /dev/zero is refused
  without being opened);
- its size is checked before it is read: at most MAX_BYTES (params.yaml is about 60 KB);
- it must be UTF-8: a byte that is not is named with its line and offset;
- a key written twice in one mapping is refused with both lines (YAML would keep the last one silently);
- aliases are counted before they are expanded: the document is composed as YAML's node graph (an alias is a
  second reference to one node, so composing costs what the file's size does), its size once expanded is
  computed over that graph with a count per node, and a document of more than MAX_VALUES values, or nested
  deeper than MAX_DEPTH, is refused before anything walks it (a few hundred bytes of nested aliases would
  otherwise expand to billions of values for every check that walks the document);
- editors' lock and backup files beside the experiments (`.#x.yaml`, `#x.yaml#`, `x.yaml~`, `.x.yaml.swp`, any
  hidden file) are not experiments (`yaml_files`).

A parsed file is a `Document`: the data, and the line of every key path, so that checks after the loader (the
claims' numbers) name lines too. libyaml's parser does the reading where PyYAML has it (jobs read params.yaml
often: fedskew.params_cache keeps the validated result besides).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedskew.config_errors import ConfigError

MAX_BYTES = 4 * 1024 * 1024    # 4 MiB: seventy times the shipped params.yaml
MAX_VALUES = 200_000           # values (keys, items, scalars) once every alias is expanded
MAX_DEPTH = 100                # levels of nesting
SUFFIXES = (".yaml", ".yml")

# libyaml's parser where PyYAML has it: the pure-Python one takes about 0.25 s for params.yaml.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE = "tag:yaml.org,2002:merge"


def key_path(path: tuple | list) -> str:
    """A key path as messages name it: `suites.tiny.seeds[1]` ("(top level)" for the document itself)."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


@dataclass(frozen=True)
class Document:
    """A parsed YAML file: its data, and the line (from 1) where each key path is written."""

    shown: str                   # the file as messages name it
    data: Any
    lines: dict[tuple, int] = field(default_factory=dict, repr=False)

    def line(self, path: tuple) -> int:
        """The line of a key path, or of the nearest enclosing one written in the file (1 for the top level)."""
        path = tuple(path)
        while path and path not in self.lines:
            path = path[:-1]
        return self.lines.get(path, 1)

    def at(self, path: tuple) -> str:
        """Where a key path is, as a message begins: `experiments/claims/mine.yaml: line 12: claims[0].x`."""
        return f"{self.shown}: line {self.line(path)}: {key_path(path)}"


def yaml_files(folder: Path, suffixes: tuple[str, ...] = SUFFIXES) -> list[Path]:
    """The YAML files a researcher keeps in `folder`, by name (none if it is not a folder): each entry named
    `*.yaml` (or another of `suffixes`) that is not hidden. Editors' lock and backup files are left out: `.#x.yaml`
    and `.x.yaml.swp` are hidden, `#x.yaml#` and `x.yaml~` end otherwise. The entries are listed, not opened or
    followed (an editor's lock is often a dangling link); reading one checks what it is (`read`)."""
    if not folder.is_dir():
        return []
    with os.scandir(folder) as entries:
        names = [entry.name for entry in entries]
    return sorted(folder / name for name in names if name.endswith(suffixes) and not name.startswith((".", "#")))


def project_of(path: Path) -> Path:
    """The project a researcher's file belongs to, for the links it may follow: the folder above `experiments/`
    for a file under it (experiments/claims/ included), else the file's own folder."""
    path = Path(os.path.abspath(path))
    for folder in path.parents:
        if folder.name == "experiments":
            return folder.parent
    return path.parent


def _kind(mode: int) -> str | None:
    """What a file that is not a regular file is, in words."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "not a regular file"


def _target(path: Path, root: Path, shown: str) -> Path:
    """The file `path` names, resolved: a link only when it stays inside the project `root` (nothing is opened)."""
    try:
        is_link = stat.S_ISLNK(os.lstat(path).st_mode)
    except FileNotFoundError:
        raise ConfigError(f"{shown}: no such file") from None
    except OSError as error:
        raise ConfigError(f"{shown}: cannot be read: {error.strerror}") from None
    resolved, project = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    if resolved != project and project not in resolved.parents:
        what = f"a link to {resolved}" if is_link else f"inside a linked folder, at {resolved}"  # the final target
        raise ConfigError(f"{shown}: {what}, outside the project ({project}); fedskew follows links only "
                          "within the project: copy the file into it")
    return resolved


def read(path: Path, root: Path, shown: str | None = None, limit: int = MAX_BYTES) -> bytes:
    """The bytes of a researcher's YAML file, read only if it is a regular file of at most `limit` bytes inside
    the project `root` (a link's target included); a ConfigError naming it otherwise."""
    shown = shown or str(path)
    target = _target(Path(path), root, shown)
    try:
        info = os.stat(target)
    except FileNotFoundError:
        raise ConfigError(f"{shown}: a link to {target}, which does not exist; fix or remove the link") from None
    if (kind := _kind(info.st_mode)) is not None:
        raise ConfigError(f"{shown}: {kind}, not a file; only regular files are read: rename it (so that it "
                          "does not end in .yaml) or move it away")
    if info.st_size > limit:
        raise ConfigError(f"{shown}: {info.st_size:,} bytes, more than the {limit:,} a YAML file of fedskew may "
                          "hold; split it (experiments/<name>.yaml) or shorten it")
    # O_NONBLOCK: should the file have been swapped for a pipe since its metadata was read, opening it returns at
    # once; fstat then sees what was opened, and at most `limit` + 1 bytes are read of it.
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(target, flags)
    except OSError as error:
        raise ConfigError(f"{shown}: cannot be read: {error.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        opened = os.fstat(handle.fileno())
        if (kind := _kind(opened.st_mode)) is not None:
            raise ConfigError(f"{shown}: {kind}, not a file; only regular files are read")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ConfigError(f"{shown}: more than the {limit:,} bytes a YAML file of fedskew may hold")
    return data


def load(path: Path, root: Path, shown: str | None = None) -> Document:
    """A researcher's YAML file, read (`read`) and parsed (`parse`)."""
    shown = shown or str(path)
    return parse(read(path, root, shown), shown)


def parse(data: bytes, shown: str) -> Document:
    """A YAML document from a file's bytes: UTF-8, no key written twice, at most MAX_VALUES values once aliases
    are expanded, at most MAX_DEPTH levels deep; a ConfigError naming the file, the line and the key otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ConfigError(f"{shown}: line {line}: byte {error.start} (0x{data[error.start]:02x}) is not UTF-8; save "
                          "the file as UTF-8") from None
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return Document(shown, None, {(): 1})
        _check_expansion(node, shown)
        lines = _key_lines(loader, node, shown)
        return Document(shown, loader.construct_document(node), lines)
    except yaml.MarkedYAMLError as error:
        raise ConfigError(f"{shown}: not valid YAML: {_yaml_problem(error)}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{shown}: not valid YAML: {' '.join(str(error).split())}") from None
    except RecursionError:
        raise ConfigError(f"{shown}: nested too deeply for YAML's reader; at most {MAX_DEPTH} levels") from None
    finally:
        loader.dispose()


def _yaml_problem(error: yaml.MarkedYAMLError) -> str:
    """A YAML syntax error in one line: where, and what."""
    mark = error.problem_mark or error.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context = f"{error.context}: " if error.context else ""
    return where + " ".join(f"{context}{error.problem or ''}".split())


def _children(node: yaml.Node) -> list[tuple[Any, yaml.Node]]:
    """(path step, node) of a node's children as composed: a mapping's keys and values, a sequence's items."""
    if isinstance(node, yaml.MappingNode):
        out = []
        for key, value in node.value:
            step = key.value if isinstance(key, yaml.ScalarNode) else "?"
            out += [(step, key), (step, value)]
        return out
    if isinstance(node, yaml.SequenceNode):
        return list(enumerate(node.value))
    return []


def _check_expansion(root: yaml.Node, shown: str) -> None:
    """Refuse a document that expands, through its aliases, beyond MAX_VALUES values or MAX_DEPTH levels, or that
    contains itself. Each node's expanded size is counted once (a node reached again through an alias reuses its
    count), so this costs what the composed graph does, however far the aliases would expand."""
    size: dict[int, int] = {}
    open_nodes: set[int] = set()   # the nodes on the current path from the root: reaching one again is a cycle
    stack: list[tuple[yaml.Node, tuple, bool]] = [(root, (), False)]
    while stack:
        node, path, done = stack.pop()
        if done:
            open_nodes.discard(id(node))
            size[id(node)] = total = 1 + sum(size[id(child)] for _, child in _children(node))
            if total > MAX_VALUES:
                raise ConfigError(f"{shown}: line {node.start_mark.line + 1}: {key_path(path)}: holds more than "
                                  f"{MAX_VALUES:,} values once its aliases (*name) are expanded; write fewer values, "
                                  "or fewer aliases of aliases")
            continue
        if id(node) in size:
            continue
        if id(node) in open_nodes:
            raise ConfigError(f"{shown}: line {node.start_mark.line + 1}: {key_path(path)}: an alias refers to a "
                              "value that contains it; a value cannot contain itself")
        if len(path) > MAX_DEPTH:
            raise ConfigError(f"{shown}: line {node.start_mark.line + 1}: {key_path(path)}: nested more than "
                              f"{MAX_DEPTH} levels deep")
        open_nodes.add(id(node))
        stack.append((node, path, True))
        stack.extend((child, (*path, step), False) for step, child in _children(node) if id(child) not in size)


def _key_lines(loader, root: yaml.Node, shown: str) -> dict[tuple, int]:
    """The line of every key path of the expanded document (bounded: `_check_expansion` ran), refusing a key
    written twice in one mapping. Keys a mapping takes from `<<: *anchor` count where the anchor writes them, and
    its own keys override them, as YAML merges them."""
    lines: dict[tuple, int] = {(): root.start_mark.line + 1}
    stack: list[tuple[yaml.Node, tuple]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                lines[(*path, index)] = item.start_mark.line + 1
                stack.append((item, (*path, index)))
        elif isinstance(node, yaml.MappingNode):
            for key, key_node, value in _entries(loader, node, path, shown):
                lines.setdefault((*path, key), key_node.start_mark.line + 1)
                stack.append((value, (*path, key)))
    return lines


def _entries(loader, node: yaml.MappingNode, path: tuple, shown: str) -> list[tuple[Any, yaml.Node, yaml.Node]]:
    """(key, key node, value node) of a mapping: its own keys (none written twice), then those it merges in
    (`<<`) that it does not write itself."""
    own: dict[Any, yaml.Node] = {}
    merged: list[tuple[Any, yaml.Node, yaml.Node]] = []
    entries = []
    for key_node, value in node.value:
        if key_node.tag == _MERGE:
            sources = value.value if isinstance(value, yaml.SequenceNode) else [value]
            for source in sources:
                if isinstance(source, yaml.MappingNode):
                    merged += _entries(loader, source, path, shown)
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = own.get(key)
        except TypeError:
            raise ConfigError(f"{shown}: line {key_node.start_mark.line + 1}: {key_path(path)}: a key must be a "
                              "single value (a name or a number), not a list or a mapping") from None
        if first is not None:
            raise ConfigError(f"{shown}: line {key_node.start_mark.line + 1}: {key_path((*path, key))}: key {key!r} "
                              f"is written twice in one mapping, on lines {first.start_mark.line + 1} and "
                              f"{key_node.start_mark.line + 1}; keep one of them")
        own[key] = key_node
        entries.append((key, key_node, value))
    seen = set(own)
    for key, key_node, value in merged:
        if key not in seen:  # the first merged mapping that writes a key wins, as YAML merges
            seen.add(key)
            entries.append((key, key_node, value))
    return entries
