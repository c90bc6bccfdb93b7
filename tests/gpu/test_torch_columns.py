"""Torch tensors between operators, on the CPU (so CI covers what the GPU tests check on a
GPU): a batching operator's tensor output stays the tensor (``TorchColumn``) while its
Table stays in the process (a fused stage's next operator, the next stage on the same
executor), and becomes numpy, with the same values, when read as numpy or sent on."""

from __future__ import annotations

import numpy as np
import pytest

from executors.hosts.cluster import LocalCluster
from executors.hosts.cluster_config import ClusterConfig
from executors.worker import fused
from executors.worker.stage_runner import BoundStage
from flow import ColumnType, Flow, Table
from flow.errors import DataTypeError, OperatorOutputError
from flow.table import Column, TorchColumn, torch_column
from flow.types import build_column
from optimizer import optimize

torch = pytest.importorskip("torch")

SCHEMA = {"x": ColumnType.tensor(np.float32, (4,))}


def rows(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.integers(0, 4, 4).astype(np.float32)} for _ in range(n)]


# -- operators (module level: plans carry them) ------------------------------------------------


def embed(table):
    """(n, 3) float32 tensor, and where each row lies."""
    emb = table.tensor("x") @ torch.ones(4, 3)
    return emb, np.array([emb[i].data_ptr() for i in range(len(emb))], dtype=np.int64)


def head(table):
    """Reads embed's tensor; says how it came."""
    col = table.column("emb")
    t = table.tensor("emb")
    held = isinstance(col, TorchColumn)
    n = len(table)
    same = np.array([t[i].data_ptr() == p for i, p in enumerate(table["ptr"].tolist())])
    return t.sum(dim=1), np.full(n, held), np.full(n, held and not col.on_host), same


def mixed(table):
    """A 2-d tensor, a 1-d tensor (a scalar column) and a bfloat16 one (numpy lacks it)."""
    x = table.tensor("x")
    return x * 2, x.sum(dim=1), (x * 3).to(torch.float16)


def wrong_rows(table):
    return torch.zeros(len(table) + 1, 2)


def handover_flow(name: str) -> Flow:
    f = Flow(name, schema=SCHEMA)
    f.map(embed, names=["emb", "ptr"], batching=True).map(
        head, names=["score", "held", "untouched", "same"], batching=True
    )
    return f


# -- the column ------------------------------------------------------------------------------------


def test_a_torch_output_becomes_a_column_of_the_numpy_type():
    t = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    col = torch_column(t, 4)
    assert type(col) is TorchColumn and col.device == "cpu" and len(col) == 4 and not col.on_host
    ctype, arr, _ = build_column(t.numpy(), "e")
    assert col.type == ctype
    table = Table({"e": col}, np.arange(4, dtype=np.int64))
    assert table.tensor("e").data_ptr() == t.data_ptr()  # no copy
    assert not col.on_host
    assert table.equals(Table.from_dict({"e": arr}))  # equality reads it as numpy: one host copy
    assert col.on_host and col.values is col.values
    assert table.to_pylist()[1]["e"].tolist() == [3.0, 4.0, 5.0]


@pytest.mark.parametrize(
    "value",
    [
        torch.zeros(4),  # 1-d: a scalar column (its NaNs are missing values): numpy's path
        torch.zeros(3, 2),  # not 4 rows
        torch.zeros(4, 2, dtype=torch.bfloat16),  # numpy has no bfloat16
        np.zeros((4, 2)),
    ],
)
def test_only_row_major_tensors_numpy_can_hold_stay_tensors(value):
    assert torch_column(value, 4) is None


def test_take_and_concat_stay_on_the_tensors_device():
    t = torch.arange(20, dtype=torch.float32).reshape(5, 4)
    table = Table({"e": torch_column(t, 5)}, np.arange(5, dtype=np.int64))
    part = table.take([1, 2, 3])
    assert type(part._cols["e"]) is TorchColumn
    assert part.tensor("e").data_ptr() == t[1].data_ptr()  # consecutive rows: a view
    shuffled = table.take([4, 0])
    assert type(shuffled._cols["e"]) is TorchColumn and shuffled.tensor("e").tolist() == [t[4].tolist(), t[0].tolist()]
    both = Table.concat([part, shuffled])
    assert type(both._cols["e"]) is TorchColumn
    assert both["e"].tolist() == t[[1, 2, 3, 4, 0]].tolist()
    assert not table._cols["e"].on_host
    assert table.take([]).num_rows == 0
    split = table.split_by_qid()
    assert all(type(p._cols["e"]) is TorchColumn for p in split.values())
    # missing rows (outer joins) take the host path, as for any column
    padded = table._cols["e"].take(np.array([0, -1]))
    assert type(padded) is Column and padded.to_list()[1] is None
    # with a numpy part, the rows are put together on the host
    other = Table.from_dict({"e": np.ones((2, 4), dtype=np.float32)}, qid=[7, 8])
    joined = Table.concat([part, other])
    assert type(joined._cols["e"]) is Column
    assert joined["e"].tolist() == t[[1, 2, 3]].tolist() + [[1.0] * 4] * 2


def test_table_tensor_of_numpy_columns_shares_their_memory():
    t = Table.from_dict({"x": np.ones((3, 2), np.float32), "i": [1, 2, 3], "s": ["a", "b", "c"]})
    assert t.tensor("x").data_ptr() == t.column("x").values.ctypes.data
    assert t.tensor("i").tolist() == [1, 2, 3]
    with pytest.raises(DataTypeError, match="'s'"):
        t.tensor("s")
    with pytest.raises(DataTypeError, match="missing"):
        Table.from_dict({"i": [1, None]}).tensor("i")
    frozen = np.ones((2, 2), np.float32)
    frozen.flags.writeable = False
    assert Table({"f": Column(ColumnType.tensor(np.float32, (2,)), frozen)}, np.arange(2)).tensor("f").shape == (2, 2)


# -- in a stage ----------------------------------------------------------------------------------------


def test_fused_operators_hand_the_tensor_over_and_answer_flow_runs_rows():
    f = handover_flow("fused-handover")
    (stage,) = optimize(f).stages.values()
    assert len(stage.nodes) >= 2, "embed and head fused into one stage"
    table = Table.from_pylist(rows(6))
    out = BoundStage(stage)([table])
    assert out["held"].all() and out["untouched"].all() and out["same"].all()
    ref = f.run(rows(6))
    assert out["score"].tolist() == ref["score"].tolist()
    assert not ref["held"].any()  # flow.run's columns are numpy: the same values, another form
    fused.ENABLED = False
    try:
        generic = BoundStage(stage)([table])
    finally:
        fused.ENABLED = True
    assert generic["score"].tolist() == ref["score"].tolist()


def test_a_tensor_that_cannot_stay_one_goes_to_the_host_alone():
    f = Flow("mixed-outputs", schema=SCHEMA)
    f.map(mixed, names=["double", "total", "half"], batching=True)
    (stage,) = optimize(f).stages.values()
    out = BoundStage(stage)([Table.from_pylist(rows(3))])
    assert type(out.column("double")) is TorchColumn  # the others did not pull it to the host
    assert out.schema["total"] == ColumnType.scalar("float")
    assert out.schema["half"] == ColumnType.tensor(np.float16, (4,))
    ref = f.run(rows(3))
    assert out.schema == ref.schema
    assert out.equals(ref)


def test_a_tensor_of_the_wrong_length_is_the_same_error_as_flow_runs():
    f = Flow("wrong-rows", schema=SCHEMA)
    f.map(wrong_rows, names=["y"], batching=True)
    (stage,) = optimize(f).stages.values()
    with pytest.raises(OperatorOutputError, match="returned 4 rows"):
        BoundStage(stage)([Table.from_pylist(rows(3))])
    with pytest.raises(OperatorOutputError, match="returned 4 rows"):
        f.run(rows(3))


# -- between stages of a deployed flow ------------------------------------------------------------


@pytest.fixture(scope="module")
def one_executor():
    with LocalCluster(ClusterConfig(executors=1, threads=2, request_timeout_s=60)) as c:
        yield c


def test_stages_on_one_executor_hand_the_tensor_over_in_process(one_executor):
    f = handover_flow("handover-one-executor")
    d = one_executor.deploy(f, rules=("placement", "batching"))  # no fusion: two stages, one executor
    assert len(d.plan.stages) == 2
    out = d.invoke(rows(8))
    assert out["held"].all(), "the second stage got numpy: the Table was encoded between the stages"
    assert out["untouched"].all() and out["same"].all()
    assert out["score"].tolist() == handover_flow("ref").run(rows(8))["score"].tolist()
    # several requests at once: merged into one batch, split back, on the tensor's device
    answers = [d.invoke(rows(3, seed=s)) for s in range(4)]
    for s, a in enumerate(answers):
        assert a["score"].tolist() == handover_flow("ref").run(rows(3, seed=s))["score"].tolist()


def test_a_tensor_leaving_the_process_arrives_with_its_values(one_executor):
    f = Flow("tensor-answer", schema=SCHEMA)
    f.map(embed, names=["emb", "ptr"], batching=True)  # the sink's output: sent to the gateway
    d = one_executor.deploy(f)
    ref = f.run(rows(5))
    out = d.invoke(rows(5))  # Arrow
    assert out.schema["emb"] == ref.schema["emb"] == ColumnType.tensor(np.float32, (3,))
    assert out["emb"].tolist() == ref["emb"].tolist()
    body = {"rows": [{"x": r["x"].tolist()} for r in rows(5)]}["rows"]
    answer = one_executor.http.post(f"/flows/{f.name}", json=body)  # JSON: nested lists
    assert answer.status_code == 200, answer.text
    assert [r["emb"] for r in answer.json()["rows"]] == ref["emb"].tolist()
    one = one_executor.http.post(f"/flows/{f.name}", json=body[0])  # one object: the relayed path
    assert one.status_code == 200, one.text
    assert one.json()["rows"][0]["emb"] == ref["emb"].tolist()[0]
