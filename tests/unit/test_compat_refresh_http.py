"""`compat refresh` over HTTP: a PEP 691 simple index and a torch wheel served from 127.0.0.1 by a server that
answers byte ranges; the facts come out of the wheel's members, read with range requests (not the whole file)."""

from __future__ import annotations

import json
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from attnforge.matrix.compat import packaged_tables
from attnforge.matrix.compat_refresh.index import LiveIndex
from attnforge.matrix.compat_refresh.refresh import refresh

WHEEL = "torch-2.99.0-cp313-cp313-manylinux_2_28_x86_64.whl"
FT_WHEEL = "torch-2.99.0-cp313-cp313t-manylinux_2_28_x86_64.whl"
MEMBERS = {
    "torch/version.py": "__version__ = '2.99.0+cu142'\ncuda: Optional[str] = '14.2'\n",
    "torch-2.99.0.dist-info/METADATA": "Name: torch\nVersion: 2.99.0\nRequires-Python: >=3.13\n"
    'Requires-Dist: cuda-toolkit[cudart]==14.2.1; platform_system == "Linux"\n\nlong description\n',
    "torch/include/ATen/ATen.h": "#if __cplusplus < 202302L\n#error C++23 or later compatible compiler is required\n#endif\n",
    "torch/include/ATen/cuda/detail/PhiloxCudaStateRaw.cuh": "struct S {\n  uint64_t offset_intragraph_ = 0;\n};\n",
    "torch/share/cmake/Torch/TorchConfig.cmake": 'set(TORCH_CXX_FLAGS "")\n',
    "torch/lib/big.bin": "x" * 3_000_000,
}


class Handler(BaseHTTPRequestHandler):
    root: Path
    ranges: ClassVar[list[str]] = []

    def log_message(self, *args: object) -> None:
        return None

    def do_GET(self) -> None:
        if self.path.startswith("/simple/"):
            name = self.path.split("/")[2]
            files = [
                {
                    "filename": f,
                    "url": f"/files/{f}",
                    "requires-python": ">=3.13",
                    "upload-time": "2027-01-02T03:04:05Z",
                }
                for f in (WHEEL, FT_WHEEL)
            ]
            body = json.dumps({"name": name, "files": files if name == "torch" else []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
        else:
            data = (self.root / self.path.rsplit("/", 1)[1]).read_bytes()
            rng = self.headers.get("Range", "")
            self.ranges.append(rng)
            start, _, end = rng.removeprefix("bytes=").partition("-")
            lo, hi = int(start), min(int(end), len(data) - 1)
            body = data[lo : hi + 1]
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {lo}-{hi}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    for name in (WHEEL, FT_WHEEL):
        with zipfile.ZipFile(tmp_path / name, "w", zipfile.ZIP_STORED) as zf:
            for member, text in MEMBERS.items():
                zf.writestr(member, text)
    Handler.root, Handler.ranges = tmp_path, []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/simple"
    httpd.shutdown()


def test_a_new_family_read_through_range_requests(server: str) -> None:
    report = refresh(packaged_tables(), LiveIndex(server), today="2027-01-03")
    (finding,) = [f for f in report.findings if f.table == "torch"]
    row = finding.row
    assert finding.kind == "new" and row["family"] == "2.99" and row["released"] == "2027-01-02"
    assert row["pypi_cuda"] == "14.2" and row["cxx_std"] == 23 and row["cxx11_abi"] == [True]
    assert (
        row["python"] == ["3.13"] and row["free_threaded"] == ["3.13"] and row["requires_python"] == ">=3.13"
    )
    assert "cuda 14.2.1" in row["source"] and server in row["source"]
    # the 3 MB member was never fetched: a few 256 KiB ranges, not the whole file
    assert 0 < len(Handler.ranges) < 8 and all(r.startswith("bytes=") for r in Handler.ranges)
