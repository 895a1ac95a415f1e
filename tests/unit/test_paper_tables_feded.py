"""FedED (Guo et al.) Tables 1-7: shapes and spot values checked against the paper text
(/work/shared/papers/002_a71cfa076cdd2438.txt)."""
import pytest

from fedskew.reproduce.paper_tables import load_paper_table
from tests.helpers import assert_printed

# (rows, columns) counted in the paper independently of the YAML files.
SHAPES = {
    "feded_t1": (9, 12),  # 9 methods x 4 datasets x β in {0.5, 0.1, 0.05}
    "feded_t2": (9, 3),   # 9 methods x CIFAR10 s=2 / CIFAR100 s=20 / TinyImageNet s=40
    "feded_t3": (9, 6),   # 9 methods x 3 backbones x β in {0.1, 0.05}
    "feded_t4": (9, 6),   # 9 methods x {40, 60, 80} rounds x β in {0.1, 0.05}
    "feded_t5": (4, 3),   # 4 loss combinations x 3 datasets
    "feded_t6": (6, 3),   # FedAvg/FedED, FedEXP/+FedED, FedSAM/+FedED x 3 datasets
    "feded_t7": (2, 5),   # CIFAR10/CIFAR100 x 5 λ values
}

# (table, row, column, value, pm or None)
SPOT = [
    ("feded_t1", "FedAvg", "MNIST / β=0.5", 98.96, 0.00),
    ("feded_t1", "FedLC", "MNIST / β=0.05", 85.56, 0.18),
    ("feded_t1", "FedSAM", "TinyImageNet / β=0.05", 41.14, 0.23),
    ("feded_t1", "FedNTD", "CIFAR10 / β=0.05", 68.71, 0.27),
    ("feded_t1", "FedED", "CIFAR10 / β=0.05", 75.71, 0.28),
    ("feded_t1", "FedED", "TinyImageNet / β=0.05", 45.23, 0.15),
    ("feded_t2", "FedAvg", "CIFAR10 / s=2", 44.63, 0.77),
    ("feded_t2", "FedSAM", "TinyImageNet / s=40", 37.55, 0.10),
    ("feded_t2", "FedED", "CIFAR10 / s=2", 68.03, 0.18),
    ("feded_t2", "FedED", "CIFAR100 / s=20", 64.95, 0.01),
    ("feded_t3", "FedAvg", "ResNet18 / β=0.1", 73.84, None),
    ("feded_t3", "FedLC", "ResNet18 / β=0.05", 48.94, None),
    ("feded_t3", "FedRS", "ResNet32 / β=0.05", 66.87, None),
    ("feded_t3", "FedED", "MobileNetV2 / β=0.05", 75.71, None),
    ("feded_t4", "FedAvg", "40 comm / β=0.1", 74.62, None),
    ("feded_t4", "FedNTD", "60 comm / β=0.05", 66.48, None),
    ("feded_t4", "FedED", "80 comm / β=0.05", 75.25, None),
    ("feded_t5", "L_cal", "CIFAR10", 55.38, None),
    ("feded_t5", "L_cal + L_dis", "CIFAR100", 64.24, None),
    ("feded_t5", "L_cal + L_logit", "TinyImageNet", 44.90, None),
    ("feded_t5", "L_cal + L_dis + L_logit", "CIFAR10", 75.71, None),
    ("feded_t6", "FedAvg", "TinyImageNet", 36.15, None),
    ("feded_t6", "FedEXP + FedED", "TinyImageNet", 44.76, None),
    ("feded_t6", "FedSAM + FedED", "CIFAR10", 75.92, None),
    ("feded_t7", "CIFAR10", "λ=0.05", 74.70, None),
    ("feded_t7", "CIFAR100", "λ=0.5", 65.71, None),
    ("feded_t7", "CIFAR100", "λ=1", 65.18, None),
]


@pytest.mark.parametrize("table_id,shape", sorted(SHAPES.items()))
def test_shape(table_id, shape):
    table = load_paper_table(table_id)
    assert table.shape == shape
    assert table.paper == "FedED"
    assert all(c.marker is None for c in table.cells.values())  # no dash or lost value in FedED


@pytest.mark.parametrize("table_id,row,column,value,pm", SPOT)
def test_spot_values(table_id, row, column, value, pm):
    assert_printed(table_id, row, column, value, pm)


def test_every_table_has_three_spot_checks():
    for table_id in SHAPES:
        assert sum(1 for s in SPOT if s[0] == table_id) >= 3


def test_pm_only_in_tables_1_and_2():
    for table_id in SHAPES:
        pms = [c.pm for c in load_paper_table(table_id).cells.values()]
        if table_id in ("feded_t1", "feded_t2"):
            assert all(p is not None for p in pms)
        else:
            assert all(p is None for p in pms)


@pytest.mark.parametrize("table_id,base", [("feded_t5", {r: "L_cal" for r in ("L_cal + L_dis", "L_cal + L_logit", "L_cal + L_dis + L_logit")}),
                                           ("feded_t6", {"FedED": "FedAvg", "FedEXP + FedED": "FedEXP", "FedSAM + FedED": "FedSAM"})])
def test_printed_gains_match_values(table_id, base):
    """The '(+x)' printed beside Tables 5 and 6 values is kept in the note; it equals value - base row."""
    table = load_paper_table(table_id)
    for row, ref in base.items():
        for column in table.columns:
            cell = table.cell(row, column)
            gain = float(cell.note.split("(")[1].rstrip(")"))
            assert gain == pytest.approx(cell.value - table.value(ref, column), abs=1e-6)


def test_table3_mobilenet_repeats_table1_cifar10():
    t1, t3 = load_paper_table("feded_t1"), load_paper_table("feded_t3")
    for row in t1.rows:
        for beta in ("0.1", "0.05"):
            assert t3.value(row, f"MobileNetV2 / β={beta}") == t1.value(row, f"CIFAR10 / β={beta}")
