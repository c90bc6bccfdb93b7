"""The seed's example pipelines as small flows with plain functions as models.

ensemble:    preprocess -> two models in parallel -> join -> pick
cascade:     model -> filter low confidence -> bigger model -> left join -> pick
competition: preprocess -> anyof(3 models, valid=confidence threshold) -> pick
recommender: parse -> lookup(user's history, per row) -> candidate -> lookup(item, per row)
             -> lookup(fixed bias) -> rank
"""

from __future__ import annotations

import numpy as np

from flow import Flow


def preprocess(row):
    return np.array([row.raw, row.raw * 2.0])


def resnet(table):  # batching: whole Table in, one value per row out
    img = table["img"]
    return [(img[:, 0] * 10).astype(int) % 3, np.full(len(table), 0.7)]


def inception(table):
    img = table["img"]
    return [(img[:, 1] * 10).astype(int) % 3, np.full(len(table), 0.8)]


def pick_best(row):
    return row.cls_a if row.conf_a >= row.conf_b else row.cls_b


def ensemble() -> Flow:
    flow = Flow("ensemble", schema={"raw": float})
    img = flow.map(preprocess, names=["img"])
    a = img.map(resnet, names=["cls_a", "conf_a"], batching=True, gpu=True)
    b = img.map(inception, names=["cls_b", "conf_b"], batching=True, gpu=True)
    a.join(b).map(pick_best, names=["cls"])
    return flow


def small_net(table):
    img = table["img"]
    return [img, (img[:, 0] * 10).astype(int) % 3, 0.5 + (img[:, 0] % 1.0) / 2]


def low_confidence(row):
    return row.conf < 0.85


def big_net(row):
    return int(row.img[1] * 10) % 3, 0.99


def pick(row):
    return row.cls if row.cls2 is None else row.cls2


def cascade() -> Flow:
    flow = Flow("cascade", schema={"raw": float})
    img = flow.map(preprocess, names=["img"])
    fast = img.map(small_net, names=["img", "cls", "conf"], batching=True, gpu=True)
    slow = fast.filter(low_confidence).map(big_net, names=["cls2", "conf2"], gpu=True, high_variance=True)
    fast.join(slow, how="left").map(pick, names=["cls"])
    return flow


def small(row):
    return int(row.img[0] * 10) % 3, 0.95 if row.img[0] > 1 else 0.5


def medium(row):
    return int(row.img[0] * 10) % 3, 0.95 if row.img[0] > 0.5 else 0.6


def large(row):
    return int(row.img[1] * 10) % 3, 0.99


def confident(row):
    return row.conf >= 0.9


def label(row):
    return f"class-{row.cls}"


def competition() -> Flow:
    flow = Flow("competition", schema={"raw": float})
    img = flow.map(preprocess, names=["img"])
    best = img.anyof(small, medium, large, names=["cls", "conf"], valid=confident)
    best.map(label, names=["label"])
    return flow


def parse_user(row):
    return row.request.split(":")[0]


def top_item(row):
    return row.history.split(",")[0]


def rank(row):
    return row.item, row.item_score + row.bias


def recommender() -> Flow:
    flow = Flow("recommender", schema={"request": str})
    user = flow.map(parse_user, names=["user"])
    hist = user.lookup(column="user", name="history")
    cand = hist.map(top_item, names=["item"])
    scored = cand.lookup(column="item", name="item_score").lookup("bias", name="bias")
    scored.map(rank, names=["item", "score"])
    return flow


RECOMMENDER_STORE = {"u1": "i2,i1", "u2": "i1", "i1": 0.5, "i2": 0.25, "bias": 1.0}
RECOMMENDER_ROWS = [{"request": "u1:home"}, {"request": "u2:cart"}, {"request": "u1:search"}]
RAW_ROWS = [{"raw": x} for x in (0.12, 0.57, 1.33, 2.08, 0.91)]

EXAMPLES = {"ensemble": ensemble, "cascade": cascade, "competition": competition, "recommender": recommender}
