"""The shared argument rules of admission.py."""

import pytest
import torch

from dsv41_kernels.admission import _owns_its_elements, check_outputs


@pytest.mark.parametrize(
    "make, owns",
    [
        (lambda: torch.zeros(3, 4), True),
        (lambda: torch.zeros(3, 4).t(), True),
        (lambda: torch.zeros(3, 4)[:, :2], True),
        (lambda: torch.zeros(3, 4)[::2], True),
        (lambda: torch.zeros(0, 5), True),
        (lambda: torch.zeros(1, 4).expand(1, 4), True),
        (lambda: torch.zeros(4).expand(3, 4), False),
        (lambda: torch.zeros(10).as_strided((3, 4), (1, 1)), False),
        (lambda: torch.zeros(10).as_strided((2, 4), (3, 1)), False),
    ],
)
def test_an_output_owns_its_elements(make, owns):
    assert _owns_its_elements(make()) is owns


def test_outputs_are_refused_by_name():
    rows = torch.zeros(3, 4)
    check_outputs({"a": rows[0], "b": rows[1], "c": None})
    with pytest.raises(ValueError, match="^out has overlapping elements"):
        check_outputs({"out": torch.zeros(4).expand(3, 4)})
    with pytest.raises(ValueError, match="^y and scales share memory"):
        check_outputs({"y": rows, "scales": rows[2]})


def test_admission_argument_is_an_admission_or_none():
    from dsv41_kernels.admission import check_admission, refuse

    assert check_admission(None) is None
    refused = refuse("no")
    assert check_admission(refused) is refused
    with pytest.raises(TypeError, match="^admission must be an Admission"):
        check_admission("kernel")
