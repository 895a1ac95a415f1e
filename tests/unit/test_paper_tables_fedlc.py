"""FedLC (Zhang et al., ICML 2022) Tables 1-7: shapes and spot values, checked against the paper by hand."""
import pytest

from fedskew.reproduce.paper_tables import load_paper_table
from tests.helpers import assert_printed

SHAPES = {
    "fedlc_t1": (7, 12),   # 7 methods x (SVHN, CIFAR10, CIFAR100) x beta in {0.05, 0.1, 0.3, 0.5}
    "fedlc_t2": (7, 8),    # 7 methods x CIFAR10 alpha in {2,4,6,8} + CIFAR100 alpha in {20,40,60,80}
    "fedlc_t3": (7, 4),    # ImageNet-subset: alpha=2, alpha=4, beta=0.1, beta=0.3
    "fedlc_t4": (7, 4),    # Synthetic(0,0), (0.5,0.5), (1,1), FEMNIST
    "fedlc_t5": (16, 4),   # 4 blocks E=1/5/10/20 x 4 methods; CIFAR10/SVHN x beta=0.5/alpha=5
    "fedlc_t6": (7, 4),    # m = 10, 30, 50, 100
    "fedlc_t7": (4, 4),    # FedAvg, Ours, Ours+Scaffold, Ours+FedProx
}

# (table, row, column, value, pm or None), read off the paper
SPOTS = [
    ("fedlc_t1", "FedAvg", "SVHN / β=0.05", 69.51, 1.45),
    ("fedlc_t1", "FedRS", "CIFAR10 / β=0.05", 44.39, 1.63),
    ("fedlc_t1", "Ours", "CIFAR10 / β=0.05", 54.55, 1.70),
    ("fedlc_t1", "Ours", "CIFAR100 / β=0.5", 44.96, 1.71),
    # the three cells blank in the ICML rendering, taken from the arXiv rendering
    ("fedlc_t1", "FedProx", "CIFAR10 / β=0.3", 57.88, 0.93),
    ("fedlc_t1", "FedProx", "CIFAR100 / β=0.05", 22.92, 1.71),
    ("fedlc_t1", "Scaffold", "SVHN / β=0.3", 86.32, 1.19),
    ("fedlc_t2", "FedAvg", "CIFAR10 / α=2", 52.23, 1.01),
    ("fedlc_t2", "FedNova", "CIFAR10 / α=6", 80.18, 1.03),
    ("fedlc_t2", "FedOpt", "CIFAR100 / α=80", 51.27, 1.95),
    ("fedlc_t2", "Ours", "CIFAR100 / α=20", 47.77, 0.84),
    ("fedlc_t3", "FedAvg", "α=2", 53.87, None),
    ("fedlc_t3", "FedRS", "β=0.1", 47.23, None),
    ("fedlc_t3", "Ours", "β=0.1", 53.24, None),     # the prose says 54.43; the table prints 53.24
    ("fedlc_t3", "Ours", "β=0.3", 63.81, None),
    ("fedlc_t4", "FedAvg", "Synthetic(0,0)", 72.09, 1.19),
    ("fedlc_t4", "FedOPT", "FEMNIST", 86.56, 0.48),
    ("fedlc_t4", "FedRS", "Synthetic(1,1)", 66.39, 1.41),
    ("fedlc_t4", "Ours", "Synthetic(1,1)", 75.46, 0.52),  # the prose says 75.45
    ("fedlc_t5", "E=1 / FedAvg", "CIFAR10 / β=0.5", 54.25, None),
    ("fedlc_t5", "E=1 / Ours", "CIFAR10 / β=0.5", 70.41, None),
    ("fedlc_t5", "E=5 / FedNova", "SVHN / β=0.5", 90.17, None),
    ("fedlc_t5", "E=20 / Ours", "SVHN / α=5", 89.46, None),
    ("fedlc_t6", "FedAvg", "m=10", 57.19, None),
    ("fedlc_t6", "FedNova", "m=100", 33.30, None),
    ("fedlc_t6", "Ours", "m=100", 43.81, None),
    ("fedlc_t7", "FedAvg", "CIFAR10 / β=0.3", 60.18, None),
    ("fedlc_t7", "Ours+Scaffold", "SVHN / α=5", 89.34, None),
    ("fedlc_t7", "Ours+FedProx", "SVHN / β=0.3", 89.49, None),
]


@pytest.mark.parametrize("table_id, shape", sorted(SHAPES.items()))
def test_shape(table_id, shape):
    table = load_paper_table(table_id)
    assert table.shape == shape
    assert table.paper == "FedLC" and table.table == table_id[-1]
    assert all(c.marker is None for c in table.cells.values())  # every FedLC number survived in one rendering


@pytest.mark.parametrize("table_id, row, column, value, pm", SPOTS)
def test_spot_values(table_id, row, column, value, pm):
    assert_printed(table_id, row, column, value, pm)


def test_every_table_spot_checked():
    counts = {t: sum(1 for s in SPOTS if s[0] == t) for t in SHAPES}
    assert all(n >= 3 for n in counts.values()), counts


def test_labels_as_printed():
    assert load_paper_table("fedlc_t4").rows == ("FedAvg", "FedProx", "Scaffold", "FedNova", "FedOPT", "FedRS", "Ours")
    assert load_paper_table("fedlc_t5").rows[4:8] == ("E=5 / FedAvg", "E=5 / FedProx", "E=5 / FedNova", "E=5 / Ours")
    assert load_paper_table("fedlc_t7").rows == ("FedAvg", "Ours", "Ours+Scaffold", "Ours+FedProx")
