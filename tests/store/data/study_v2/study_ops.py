from pathlib import Path

HERE = Path(__file__).parent


def features(subject, bins):
    salt = (HERE / "salt.txt").read_text().strip()
    out = subject.workdir / "features.txt"
    out.write_text(f"bins={bins} x={subject.fields['x']} salt={salt}")
    big = subject.id in (HERE / "big.txt").read_text().split()
    return {"file": str(out), "salt": salt, "payload": "p" * (50_000 if big else 10)}


def table(collection):
    return {sid: Path(r["file"]).read_text() for sid, r in collection.items()}


def post(subject, factor):
    feat = subject.inputs["feat"]
    return f"{factor}:" + Path(feat["file"]).read_text() + ":" + feat["salt"]
