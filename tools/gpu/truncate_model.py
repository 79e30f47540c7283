#!/usr/bin/env python3
"""Writes a GGUF holding the first N layers of a real model (all metadata kept, block_count set to
N, every tensor of later layers dropped). The GPU machine gets real weights this way within the
size limit of a carried build: the depth-truncated model still exercises every tensor format,
the tokenizer and the layer loop, and both backends must agree on it.

usage: truncate_model.py IN.gguf OUT.gguf N_LAYERS
"""
import sys

import gguf


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    old = r.fields[f"{arch}.block_count"].contents()
    if not 0 < n <= old:
        print(f"N_LAYERS must be in [1, {old}], got {n}", file=sys.stderr)
        return 2
    w = gguf.GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = f.types[0]
        val = n if name == f"{arch}.block_count" else f.contents()
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, val, vt, sub_type=f.types[-1])
        else:
            w.add_key_value(name, val, vt)
    for t in r.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n:
            continue
        w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
