#!/usr/bin/env python3
"""Expected tokenizer outputs from Hugging Face (tokenizers 0.23 / transformers 5.17), run on the
GPU machine. Writes corpus ids (two pre-tokenizer variants), decodes, and chat-template renders
that tests/tokenizer compares against; with --bench, times HF encode on one core.

  python3 tools/make_tokenizer_reference.py --tokenizer .cache/tokenizer-qwen3 --out OUTDIR
  python3 tools/make_tokenizer_reference.py --tokenizer .cache/tokenizer-qwen3 --bench DOCS.jsonl
"""
import argparse
import copy
import itertools
import json
import os
import random
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "tokenizer")

# The Qwen3.5 pre-tokenizer regex (architecture reference §7): adds \p{M} to letter runs.
QWEN3_5_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
                 r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus():
    fixed = [
        "", " ", "  ", "\n", "\r\n", "\t", "a", "Hello, world!", "Hello world", " Hello", "hello  world",
        "I'm here, you're there, it's fine, we've done it, they'll go, he'd say",
        "I'M HERE, YOU'RE THERE, IT'S FINE, WE'VE, THEY'LL, HE'D", "don't 'S 'sS 'Ll",
        "12345678901234567890", "3.14159 -42 1e-9 0x1F 1,000,000", "Ⅻ ½ ² ٣٤٥ ४२ 一二三",
        "line one\nline two\r\nline three\rend", "trailing spaces   ", "   leading", "a\n\n\nb",
        "tabs\t\tand\tspaces  \t mixed", "   \n   \n", "\u00a0nbsp\u00a0\u00a0x", "\u3000ideographic space",
        "def f(x):\n    return x**2  # square\n", "int main() { std::vector<int> v{1,2,3}; return 0; }",
        "for (let i = 0; i < n; ++i) {\r\n\tconsole.log(`${i}`);\r\n}", "SELECT * FROM t WHERE a >= 10;",
        '{"key": [1, 2.5, null, true], "nested": {"x": "y"}}', "https://example.com/a?b=c&d=e#frag",
        "Привет, мир! Как дела?", "Ελληνικά κείμενα", "こんにちは世界。カタカナとひらがな", "你好，世界！中文分词测试。",
        "안녕하세요 세계", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "ሰላም ልዑል",
        "Tiếng Việt có dấu", "Zażółć gęślą jaźń", "Ünïcödé çàfé naïve résumé", "ß ẞ ﬁ ﬀ İ ı",
        "e\u0301 vs \u00e9", "A\u030a\u0301 o\u0308\u0304", "\u1100\u1161\u11a8 jamo", "Å Å Å",
        "q\u0307\u0323 x\u0300\u0301\u0302\u0303", "क्षि ड़", "ที่นี่",
        "👍 😀😃 🇺🇸🇯🇵 👨‍👩‍👧‍👦 🏳️‍🌈 👩🏽‍💻 ❤️", "emoji👍inside words😀ok", "🤖🤖🤖", "\U0001F600\U0001F64F",
        "<|im_start|>user\nhi<|im_end|>", "<|endoftext|>", "a<|endoftext|>b", "<|im_start|><|im_end|>",
        "<think>\nreasoning\n</think>\n\nanswer", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
        "<tool_response>ok</tool_response>", "<|im_start", "<|im_end|", "im_end|>", "<|im_start |>",
        "< |im_end|>", "<|IM_END|>", "<think", "</think", "<<|im_end|>>", "<|im_start|>>", "<|<|endoftext|>|>",
        "<|fim_prefix|>def<|fim_suffix|>pass<|fim_middle|>", "<|vision_start|><|image_pad|><|vision_end|>",
        " <|im_end|> ", "\n<|im_end|>\n", "x  <think>  y", "&amp; &lt; &#39; \\n \\t \\\\",
        "!!!???...,,,;;;:::", "----====____", "a-b_c.d/e\\f", "$$ \\frac{a}{b} $$", "~`@#%^&*()[]{}|",
        "ａｂｃ ＡＢＣ １２３", "\u200b\u200c\u200d zero width", "\ufeffbom", "\x00\x01\x1f control", "\x7f\x80",
        "x" * 300, "ab" * 200, " " * 50, "\n" * 20, "😀" * 30, "1" * 64, "The quick brown fox " * 20,
        "Mixed 中文 and English and русский and 日本語 in one line.", "CamelCaseWordsHere snake_case_words",
        "'s", "'", "''", "it''s", "x's'y", "  's", "a 'LL b", "\u2019s curly", "o'clock", "rock'n'roll",
    ]
    rng = random.Random(20261129)
    pool = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") +
            list(" \t\n\r.,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`") +
            list("éèêëàâäôöûüçñßøåæœ") + list("абвгдежзийклмнопрстуфхцчшщыэюя") +
            list("的一是不了在人有我他这个们中来上大为和国地到以说时要就出") + list("あいうえおかきくけこアイウエオ") +
            list("αβγδεζηθ") + list("ابتثجحخد") + list("कखगघ") + ["\u0301", "\u0308", "\u0323", "\u200d", "\ufe0f"] +
            ["😀", "👍", "🇺", "🇸", "👩", "🏽", "💻"] + ["  ", "   ", "\r\n", "\n\n"] +
            ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>", "<|im_", "|>", "<tool_call>"])
    rand = []
    for i in range(500):
        n = rng.randint(1, 80)
        rand.append("".join(rng.choice(pool) for _ in range(n)))
    words = ["the", "model", "token", "Qwen", "server", "café", "naïve", "数据", "模型", "данные", "2024",
             "x86_64", "don't", "it's", "we'll", "    ", "\n", "\t", "!", "...", "👍", "e\u0301"]
    for i in range(300):
        n = rng.randint(1, 40)
        rand.append("".join(rng.choice(words) + rng.choice(["", " ", " ", "  ", "\n", ", "]) for _ in range(n)))
    return fixed + rand


def conversations():
    weather_tool = {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather for a city.\n",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
    search_tool = {"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                        "top_k": {"type": "integer", "description": "How many"}}}}}
    sys_msg = {"role": "system", "content": "You are a helpful assistant."}
    u1 = {"role": "user", "content": "What's the weather in Paris?"}
    u2 = {"role": "user", "content": "And in Tokyo? 東京は？ 🌧️"}
    a_plain = {"role": "assistant", "content": "It is sunny in Paris."}
    a_think_inline = {"role": "assistant", "content": "<think>\nLet me recall.\n</think>\n\nIt is sunny."}
    a_reason = {"role": "assistant", "content": "Sunny, 21°C.", "reasoning_content": "The user wants weather."}
    a_call_dict = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]}
    a_call_str = {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Tokyo\"}"}}]}
    a_call_two = {"role": "assistant", "content": "", "reasoning_content": "Two lookups needed.", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"type": "function", "function": {"name": "search", "arguments": {"query": "Tokyo rain", "top_k": 3,
                                                                           "filters": {"lang": "ja", "safe": True},
                                                                           "score": 0.5, "tags": ["a", None]}}}]}
    t1 = {"role": "tool", "content": "{\"temp\": 21, \"sky\": \"clear\"}"}
    t2 = {"role": "tool", "content": "Rain expected."}
    convs = [
        ([u1], None), ([sys_msg, u1], None), ([u1, a_plain], None), ([u1, a_plain, u2], None),
        ([sys_msg, u1, a_think_inline, u2], None), ([u1, a_reason], None), ([u1, a_reason, u2], None),
        ([u1, a_call_dict, t1], [weather_tool]), ([sys_msg, u1, a_call_dict, t1], [weather_tool]),
        ([u1, a_call_str, t1, a_plain], [weather_tool]), ([u1, a_call_two, t1, t2], [weather_tool, search_tool]),
        ([sys_msg, u1, a_call_two, t1, t2, a_reason, u2], [weather_tool, search_tool]),
        ([u1], [weather_tool, search_tool]), ([sys_msg, u1], [search_tool]),
        ([{"role": "user", "content": ""}], None), ([{"role": "user", "content": "  spaced \n"}], None),
        ([{"role": "system", "content": "  Be terse.  "}, {"role": "user", "content": "hi"},
          {"role": "assistant", "content": "\n\nhello"}], None),
        ([u1, {"role": "assistant", "content": "<think>a</think>b"}, u2, a_reason], None),
        ([{"role": "user", "content": "<tool_response>\nx\n</tool_response>"}], None),
    ]
    kwargs_variants = [{}, {"enable_thinking": True}, {"enable_thinking": False},
                       {"reasoning_effort": "low"}, {"reasoning_effort": "medium"},
                       {"reasoning_effort": "low", "enable_thinking": False}, {"reasoning_effort": "bogus"}]
    out = []
    for (msgs, tools), kw, agp in itertools.product(convs, kwargs_variants, [False, True]):
        out.append({"messages": msgs, "tools": tools, "kwargs": kw, "add_generation_prompt": agp})
    return out


def make(args):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    import transformers, tokenizers
    os.makedirs(args.out, exist_ok=True)
    tok_path = os.path.join(args.tokenizer, "tokenizer.json")
    tk = Tokenizer.from_file(tok_path)
    spec = json.load(open(tok_path, encoding="utf-8"))
    spec35 = copy.deepcopy(spec)
    spec35["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN3_5_REGEX
    tk35 = Tokenizer.from_str(json.dumps(spec35))
    hf = AutoTokenizer.from_pretrained(args.tokenizer)
    texts = corpus()
    cases = []
    for t in texts:
        ids = tk.encode(t).ids
        assert ids == hf.encode(t, add_special_tokens=True), repr(t)
        cases.append({"text": t, "ids": ids, "ids_qwen3_5_regex": tk35.encode(t).ids,
                      "decoded": hf.decode(ids), "decoded_skip": hf.decode(ids, skip_special_tokens=True)})
    meta = {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__}
    with open(os.path.join(args.out, "corpus_ids.json"), "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "cases": cases}, f, ensure_ascii=False, indent=0)
    templates = {"qwen3": hf.chat_template,
                 "qwen3_8_style": open(os.path.join(DATA, "qwen3_8_style_template.jinja"), encoding="utf-8").read()}
    renders = []
    for name, tmpl in templates.items():
        for c in conversations():
            try:
                r = hf.apply_chat_template(c["messages"], tools=c["tools"], tokenize=False, chat_template=tmpl,
                                           add_generation_prompt=c["add_generation_prompt"], **c["kwargs"])
                err = None
            except Exception as e:  # raise_exception in the template
                r, err = None, str(e)
            renders.append(dict(c, template=name, render=r, error=err))
    with open(os.path.join(args.out, "renders.json"), "w", encoding="utf-8") as f:
        json.dump({"meta": meta, "renders": renders}, f, ensure_ascii=False, indent=0)
    n_err = sum(r["error"] is not None for r in renders)
    print(f"wrote {len(cases)} corpus cases, {len(renders)} renders ({n_err} raise) with {meta}")


def make_bench_docs(path):
    """~4 KB documents: English licence text, C++ source (nlohmann/json.hpp) and the test corpus."""
    sources = ["/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0",
               "/usr/share/common-licenses/LGPL-2.1", "/usr/include/nlohmann/json.hpp"]
    docs = []
    for src in sources:
        cur = ""
        for line in open(src, encoding="utf-8"):
            cur += line
            if len(cur) >= 4096:
                docs.append(cur)
                cur = ""
        if cur:
            docs.append(cur)
    texts = corpus()
    for i in range(0, len(texts), 40):
        docs.append("\n".join(texts[i:i + 40]))
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    print(f"wrote {len(docs)} documents, {sum(len(d.encode()) for d in docs)} bytes to {path}")


def bench(args):
    from tokenizers import Tokenizer
    import tokenizers
    tk = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    # One JSON string per line: the documents bench_tokenizer encodes too.
    chunks = [json.loads(line) for line in open(args.bench, encoding="utf-8") if line.strip()]
    n_bytes = sum(len(c.encode("utf-8")) for c in chunks)
    best = None
    for rep in range(args.reps):
        t0 = time.perf_counter()
        n_tok = sum(len(tk.encode(c).ids) for c in chunks)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    print(json.dumps({"impl": f"hf tokenizers {tokenizers.__version__}", "bytes": n_bytes, "tokens": n_tok,
                      "chunks": len(chunks), "best_s": best, "MB_per_s": n_bytes / best / 1e6,
                      "tokens_per_s": n_tok / best}))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--tokenizer", default=".cache/tokenizer-qwen3")
    p.add_argument("--out")
    p.add_argument("--bench")
    p.add_argument("--make-bench-docs", help="write the benchmark documents (JSONL) here and exit")
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    if a.make_bench_docs:
        make_bench_docs(a.make_bench_docs)
    elif a.bench:
        bench(a)
    else:
        make(a)
