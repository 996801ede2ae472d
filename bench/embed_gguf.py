#!/usr/bin/env python3
"""Writes a sentence-transformers BERT model directory (safetensors, tokenizer.json) as a llama.cpp GGUF
(architecture `bert`), with llama.cpp's own `gguf` Python package (the `gguf-py` directory of the
llama.cpp tree that bench/llamacpp/build.sh unpacks), so llama-server runs the same weights ours does.

    bench/embed_gguf.py MODEL_DIR OUT.gguf LLAMA_CPP_TREE

llama.cpp's convert_hf_to_gguf.py does the same but imports torch and transformers, which this machine
does not have. What it writes, as that converter does for BertModel: the hyperparameters under `bert.*`,
non-causal attention, the pooling of `1_Pooling/config.json` (mean, CLS or last token), the WordPiece
vocabulary in "phantom space" form (a word-initial token gets a leading U+2581, a `##` continuation
loses its `##`, special tokens stay as they are) with their token types, and every tensor under
gguf-py's BERT name map. Tensors are written as stored (f32): the comparison is then kernel against
kernel on identical weights.
"""

import json
import pathlib
import struct
import sys


def main():
    model, out, tree = (pathlib.Path(a) for a in sys.argv[1:4])
    sys.path.insert(0, str(tree / "gguf-py"))
    import gguf  # noqa: E402  (llama.cpp's own package, from its tree)
    import numpy as np  # noqa: E402

    cfg = json.loads((model / "config.json").read_text())
    pooling = json.loads((model / "1_Pooling" / "config.json").read_text())
    tok = json.loads((model / "tokenizer.json").read_text())

    w = gguf.GGUFWriter(str(out), "bert")
    w.add_name(model.name)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg.get("layer_norm_eps", 1e-12))
    w.add_causal_attention(False)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if pooling.get("pooling_mode_mean_tokens"):
        w.add_pooling_type(gguf.PoolingType.MEAN)
    elif pooling.get("pooling_mode_cls_token"):
        w.add_pooling_type(gguf.PoolingType.CLS)
    elif pooling.get("pooling_mode_lasttoken"):
        w.add_pooling_type(gguf.PoolingType.LAST)
    else:
        raise SystemExit(f"{model}: a pooling mode llama.cpp does not have")

    vocab = tok["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    special = {a["content"] for a in tok.get("added_tokens", []) if a.get("special")}
    types, texts = [], []
    for t in tokens:
        if t in special:
            types.append(gguf.TokenType.CONTROL)
            texts.append(t)
        else:
            types.append(gguf.TokenType.NORMAL)
            texts.append(t[2:] if t.startswith("##") else "\u2581" + t)
    w.add_token_type_count(cfg.get("type_vocab_size", 2))
    w.add_tokenizer_model("bert")
    w.add_token_list(texts)
    w.add_token_types(types)
    ids = {t: i for i, t in enumerate(tokens)}
    w.add_bos_token_id(ids["[CLS]"])
    w.add_sep_token_id(ids["[SEP]"])
    w.add_unk_token_id(ids["[UNK]"])
    w.add_pad_token_id(ids["[PAD]"])
    w.add_mask_token_id(ids["[MASK]"])

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, cfg["num_hidden_layers"])
    raw = (model / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    for name, meta in header.items():
        # The pooler and the masked-LM head are not part of an embedding (llama.cpp skips them too).
        if name == "__metadata__" or name.endswith("position_ids") or "pooler." in name or name.startswith("cls."):
            continue
        if meta["dtype"] != "F32":
            raise SystemExit(f"{name}: dtype {meta['dtype']} (this script writes f32 models)")
        a, b = meta["data_offsets"]
        data = np.frombuffer(raw[8 + n + a : 8 + n + b], dtype=np.float32).reshape(meta["shape"])
        hf = name[len("bert.") :] if name.startswith("bert.") else name
        target = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise SystemExit(f"{name}: no GGUF name for it")
        w.add_tensor(target, np.ascontiguousarray(data))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(out)


if __name__ == "__main__":
    main()
