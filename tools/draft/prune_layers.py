#!/usr/bin/env python3
"""Writes a draft model for speculative decoding (docs/SPECULATIVE.md) by keeping a subset of a
model's layers: same vocabulary and tokenizer, same tensors for the kept layers (renumbered),
block_count lowered. For measuring the separate-draft-model path where no smaller model of the
same vocabulary exists (SmolLM2 135M, Gemma 3 270M are already their family's smallest).

  tools/draft/prune_layers.py MODEL.gguf OUT.gguf --keep 0,1,2,...   (layer ids of MODEL)
  tools/draft/prune_layers.py MODEL.gguf OUT.gguf --drop-every 2     (keeps the first and last)
"""
import argparse
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("out")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--keep", help="comma-separated layer ids to keep")
    g.add_argument("--drop-every", type=int, help="drop every N-th layer (never the first or last)")
    a = ap.parse_args()

    r = GGUFReader(a.model)
    arch = r.fields["general.architecture"].contents()
    n_layer = int(r.fields[f"{arch}.block_count"].contents())
    if a.keep:
        keep = sorted({int(x) for x in a.keep.split(",") if x})
    else:
        keep = [l for l in range(n_layer) if l in (0, n_layer - 1) or l % a.drop_every != 0]
    if not keep or keep[0] < 0 or keep[-1] >= n_layer:
        print(f"prune_layers: layer ids must be in [0, {n_layer})", file=sys.stderr)
        return 2
    new_id = {old: i for i, old in enumerate(keep)}

    w = GGUFWriter(a.out, arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        if f.name == f"{arch}.block_count":
            w.add_uint32(f.name, len(keep))
            continue
        vtype = GGUFValueType(f.types[0])
        value = f.contents()
        if vtype == GGUFValueType.ARRAY:
            sub = GGUFValueType(f.types[-1]) if len(f.types) > 1 else None
            if isinstance(value, list) and len(value) == n_layer and f.name.startswith(arch + "."):
                value = [value[l] for l in keep]  # per-layer arrays
            w.add_key_value(f.name, value, vtype, sub_type=sub)
        else:
            w.add_key_value(f.name, value, vtype)
    for t in r.tensors:
        name = t.name
        if name.startswith("blk."):
            old = int(name.split(".")[1])
            if old not in new_id:
                continue
            name = f"blk.{new_id[old]}." + name.split(".", 2)[2]
        # The reader's shape is GGUF order (ne0 first); raw_shape for quantized data is in bytes.
        w.add_tensor(name, np.asarray(t.data), raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{a.out}: {len(keep)} of {n_layer} layers ({','.join(map(str, keep))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
