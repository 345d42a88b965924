"""Generate the Python gRPC stubs for protos/swactor/v1 into a package root.

Run by `make protos` (and by install.sh). The stubs are build output: never edit them by hand.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"


def generate(out_dir: Path) -> list[Path]:
    protos = sorted(PROTO_ROOT.glob("swactor/v1/*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {PROTO_ROOT / 'swactor/v1'}")
    out_dir.mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p.relative_to(PROTO_ROOT)) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed (see the messages above)")
    package = out_dir / "swactor" / "v1"
    return sorted(package.glob("*_pb2*.py*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "services", help="package root to write into")
    args = parser.parse_args()
    written = generate(args.out)
    print(f"generated {len(written)} stub files into {args.out / 'swactor' / 'v1'}", file=sys.stderr)


if __name__ == "__main__":
    main()
