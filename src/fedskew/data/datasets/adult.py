"""Adult / Census Income (UCI; Kohavi 1996), as FL-FCR uses it: predict income > 50K from 14 attributes.

Source: https://archive.ics.uci.edu/ml/machine-learning-databases/adult/adult.data (32,561
rows, the official training split) and .../adult.test (16,281 rows, the official test split).

On disk: data/raw/adult/adult.data and adult.test (downloaded, or placed there by hand),
their VERIFIED.json marker and the preprocessed cache tensors.pt + tensors.json. The
preprocessing reads each file once, checking its bytes against the sha256 just verified.

Checksums: md5 5d7c39d7b8804f071cdd1f2a7c460872 (adult.data) and
35238206dfdf7f1fe215bbb874adecdc (adult.test) are pinned: they are the digests that
several public loaders pin for these UCI files (e.g. CatBoost's dataset helpers).

File format: comma-separated, a space after each comma, no header, 15 fields per row:
age, workclass, fnlwgt, education, education-num, marital-status, occupation, relationship,
race, sex, capital-gain, capital-loss, hours-per-week, native-country, income. A missing
value is '?'. adult.test starts with the comment line '|1x3 Cross validator' and its
labels end in a '.' ('>50K.'); both files end with blank lines.

Preprocessing (deterministic; the same files give the same bytes):
* rows with any missing value ('?') are dropped: 30,162 train and 15,060 test rows remain
  (missing values occur only in workclass, occupation and native-country);
* label y = 1 if income is '>50K' (after removing adult.test's trailing '.'), else 0;
* features, in this order: the 6 numeric columns (NUMERIC) standardised with the mean and
  population standard deviation (ddof 0) of the kept training rows (the test split uses
  the training statistics), then a one-hot block for each of the 8 categorical columns in
  file order, over the category list fixed in CATEGORIES (the order of UCI's adult.names),
  so train and test always have the same 105 columns (feature_names()). A value outside a
  fixed list is an error. One-hot columns stay 0/1. All attributes are kept, including
  fnlwgt and education-num (FL-FCR: "14 features");
* rows keep their file order; features are float32, labels int64.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from fedskew.data.datasets.base import FileSource
from fedskew.data.fetch import DatasetCorruptError, Reach, SourceFile, ensure_files
from fedskew.data.fetch.reading import read_verified
from fedskew.data.tensors import CACHE, cached_tensors, split_problems

log = logging.getLogger(__name__)

NAME = "adult"
ADULT_BASE_URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/"
ADULT_MD5: dict[str, str | None] = {
    "adult.data": "5d7c39d7b8804f071cdd1f2a7c460872",
    "adult.test": "35238206dfdf7f1fe215bbb874adecdc",
}
COLUMNS = ("age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
           "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country",
           "income")
NUMERIC = ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")
CATEGORIES: dict[str, tuple[str, ...]] = {  # from UCI's adult.names, in its order
    "workclass": ("Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov", "State-gov",
                  "Without-pay", "Never-worked"),
    "education": ("Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm", "Assoc-voc", "9th",
                  "7th-8th", "12th", "Masters", "1st-4th", "10th", "Doctorate", "5th-6th", "Preschool"),
    "marital-status": ("Married-civ-spouse", "Divorced", "Never-married", "Separated", "Widowed",
                       "Married-spouse-absent", "Married-AF-spouse"),
    "occupation": ("Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial", "Prof-specialty",
                   "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical", "Farming-fishing",
                   "Transport-moving", "Priv-house-serv", "Protective-serv", "Armed-Forces"),
    "relationship": ("Wife", "Own-child", "Husband", "Not-in-family", "Other-relative", "Unmarried"),
    "race": ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black"),
    "sex": ("Female", "Male"),
    "native-country": ("United-States", "Cambodia", "England", "Puerto-Rico", "Canada", "Germany",
                       "Outlying-US(Guam-USVI-etc)", "India", "Japan", "Greece", "South", "China", "Cuba", "Iran",
                       "Honduras", "Philippines", "Italy", "Poland", "Jamaica", "Vietnam", "Mexico", "Portugal",
                       "Ireland", "France", "Dominican-Republic", "Laos", "Ecuador", "Taiwan", "Haiti", "Columbia",
                       "Hungary", "Guatemala", "Nicaragua", "Scotland", "Thailand", "Yugoslavia", "El-Salvador",
                       "Trinadad&Tobago", "Peru", "Hong", "Holand-Netherlands"),
}
LABELS = {"<=50K": 0, ">50K": 1}
NUM_CLASSES = 2
PREPROCESSING = "adult-v1"


def feature_names() -> list[str]:
    """Column names of the feature matrix: numeric columns, then '<column>=<category>' one-hots."""
    return [*NUMERIC, *(f"{column}={value}" for column, values in CATEGORIES.items() for value in values)]


NUM_FEATURES = len(NUMERIC) + sum(len(values) for values in CATEGORIES.values())  # 105


def source_files() -> list[SourceFile]:
    return [SourceFile(name, (ADULT_BASE_URL + name,), md5, check=check_structure) for name, md5 in ADULT_MD5.items()]


def raw_dir(raw_root: Path) -> Path:
    return Path(raw_root) / NAME


def parse_rows(data: bytes, name: str) -> tuple[list[list[str]], int]:
    """The complete rows of the bytes of an adult.data/adult.test file named `name` (fields stripped, label
    without '.'), and how many rows were dropped for a missing value."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DatasetCorruptError(f"cannot read {name} as text: {error}") from error
    rows, dropped = [], 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("|"):  # blank lines; adult.test's '|1x3 Cross validator'
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != len(COLUMNS):
            raise DatasetCorruptError(f"{name} line {number} has {len(fields)} fields, expected {len(COLUMNS)}")
        fields[-1] = fields[-1].rstrip(".")
        if fields[-1] not in LABELS:
            raise DatasetCorruptError(f"{name} line {number}: unknown income label {fields[-1]!r}")
        if "?" in fields:
            dropped += 1
            continue
        rows.append(fields)
    if not rows:
        raise DatasetCorruptError(f"{name} has no complete rows")
    return rows, dropped


def check_structure(path: Path) -> None:
    """Used only when no md5 is pinned: the file must parse as Adult rows."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise DatasetCorruptError(f"cannot read {path.name}: {error}") from error
    _encode(parse_rows(data, path.name)[0], path.name)


def _encode(rows: list[list[str]], what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(numeric float64 [N, 6], one-hot float64 [N, 99], labels int64 [N]) of parsed rows."""
    index = {column: i for i, column in enumerate(COLUMNS)}
    try:
        numeric = np.array([[float(row[index[c]]) for c in NUMERIC] for row in rows], dtype=np.float64)
    except ValueError as error:
        raise DatasetCorruptError(f"{what}: a numeric column holds a non-number: {error}") from error
    blocks = []
    for column, values in CATEGORIES.items():
        position = {value: i for i, value in enumerate(values)}
        block = np.zeros((len(rows), len(values)), dtype=np.float64)
        for r, row in enumerate(rows):
            value = row[index[column]]
            if value not in position:
                raise DatasetCorruptError(f"{what}: {column} value {value!r} is not in fedskew's fixed category "
                                          f"list (UCI adult.names)")
            block[r, position[value]] = 1.0
        blocks.append(block)
    labels = np.array([LABELS[row[-1]] for row in rows], dtype=np.int64)
    return numeric, np.concatenate(blocks, axis=1), labels


def preprocess(train_path: Path, test_path: Path, sha256: dict[str, str]) -> dict[str, torch.Tensor]:
    """adult.data + adult.test -> standardised float32 features and int64 labels (see module doc).

    `sha256`: file name -> the digest just verified; the bytes read are checked against it
    (fedskew.data.fetch.reading), so a file that changed since it verified is refused."""
    train, test = (read_verified(path, sha256[path.name]) for path in (train_path, test_path))
    train_rows, dropped_train = parse_rows(train, train_path.name)
    test_rows, dropped_test = parse_rows(test, test_path.name)
    num_train, hot_train, y_train = _encode(train_rows, train_path.name)
    num_test, hot_test, y_test = _encode(test_rows, test_path.name)
    mean, std = num_train.mean(axis=0), num_train.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    log.info("%s: dropped %d train / %d test rows with missing values", NAME, dropped_train, dropped_test)
    return {
        "x_train": torch.from_numpy(np.concatenate([(num_train - mean) / std, hot_train], axis=1).astype(np.float32)),
        "y_train": torch.from_numpy(y_train),
        "x_test": torch.from_numpy(np.concatenate([(num_test - mean) / std, hot_test], axis=1).astype(np.float32)),
        "y_test": torch.from_numpy(y_test),
    }


def problems(tensors: dict[str, torch.Tensor]) -> list[str]:
    return split_problems(tensors, torch.float32, (NUM_FEATURES,), NUM_CLASSES)


def load_tensors(spec: dict, raw_root: Path,
                 reach: Reach = Reach.NETWORK) -> tuple[Path, dict[str, torch.Tensor]]:
    """Download/verify adult.data and adult.test, preprocess once; return the cache path and the tensors."""
    folder = raw_dir(raw_root)
    entries = ensure_files(NAME, folder, source_files(), reach)
    sha256 = {name: entry["sha256"] for name, entry in entries.items()}  # of the bytes on disk now
    key = {"preprocessing": PREPROCESSING, "sha256": sha256}
    return folder / CACHE, cached_tensors(NAME, folder, key, problems,
                                          lambda: preprocess(folder / "adult.data", folder / "adult.test", sha256))


class Adult(FileSource):
    name = NAME
    tabular = True  # one-hot and standardised columns (see the module's docstring), taken as they are
    input_shape = (NUM_FEATURES,)
    num_classes = NUM_CLASSES
    train_size = 30162  # adult.data's 32,561 rows less those with a missing value
    test_size = 15060
    load_tensors = staticmethod(load_tensors)
