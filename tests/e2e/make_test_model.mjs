// Builds the e2e test model folder: a committed fixture checkpoint (weights + config) plus a
// byte-level BPE tokenizer whose vocabulary fits the fixture's 352 ids (256 bytes, merges,
// Qwen's chat special tokens) and the Qwen3.8-style chat template used by the tokenizer tests.
// usage: node make_test_model.mjs REPO_ROOT OUT_DIR
import fs from 'node:fs';
import path from 'node:path';

const [root, out] = process.argv.slice(2);
if (!root || !out) {
  console.error('usage: node make_test_model.mjs REPO_ROOT OUT_DIR');
  process.exit(2);
}
const fixture = path.join(root, 'tests/data/tiny_wrapper_long');
fs.mkdirSync(out, { recursive: true });
for (const f of ['config.json', 'model.safetensors']) fs.copyFileSync(path.join(fixture, f), path.join(out, f));
const VOCAB = JSON.parse(fs.readFileSync(path.join(fixture, 'config.json'))).text_config.vocab_size;  // 352

// GPT-2 byte <-> unicode mapping used by ByteLevel pre-tokenizers.
const byteToUnicode = (() => {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = [...bs];
  let n = 0;
  for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
  const m = {};
  bs.forEach((b, i) => { m[b] = String.fromCodePoint(cs[i]); });
  return m;
})();
const enc = (s) => [...Buffer.from(s, 'utf8')].map((b) => byteToUnicode[b]).join('');

const specials = [
  ['<|endoftext|>', true], ['<|im_start|>', true], ['<|im_end|>', true],
  ['<think>', false], ['</think>', false], ['<tool_call>', false], ['</tool_call>', false],
  ['<tool_response>', false], ['</tool_response>', false],
];
const vocab = {};
for (let b = 0; b < 256; b++) vocab[byteToUnicode[b]] = b;
// Two-character merges of common English pairs until the vocabulary is full.
const pairs = ['th', 'he', 'in', 'er', 'an', 're', 'on', 'at', 'en', 'nd', 'ti', 'es', 'or', 'te', 'of', 'ed', 'is',
  'it', 'al', 'ar', 'st', 'to', 'nt', 'ng', 'se', 'ha', 'as', 'ou', 'io', 'le', 've', 'co', 'me', 'de', 'hi', 'ri',
  'ro', 'ic', 'ne', 'ea', 'ra', 'ce', 'li', 'ch', 'll', 'be', 'ma', 'si', 'om', 'ur', ' t', ' a', ' s', ' w', ' c',
  ' o', ' b', ' i', ' p', ' f', ' m', ' d', ' h', ' r', ' l', ' n', ' e', ' g', ' u', ' y', ' T', ' I', ' A', ' S',
  '{"', '":', '",', '"}', '\n\n', '\n<', '</', '>\n', 'ca', 'el', 'ta', 'la', 'na', 'di', 'ge', 'lo', 'no', 'ol'];
const merges = [];
let next = 256;
const nMerges = VOCAB - 256 - specials.length;
for (const p of pairs) {
  if (merges.length === nMerges) break;
  const [a, b] = [...p];
  merges.push([enc(a), enc(b)]);
  vocab[enc(p)] = next++;
}
if (merges.length !== nMerges) throw new Error(`need ${nMerges} merges, have ${merges.length}`);
const added = specials.map(([content, special], i) => ({
  id: next + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special,
}));
const tokenizer = {
  version: '1.0',
  truncation: null,
  padding: null,
  added_tokens: added,
  normalizer: { type: 'NFC' },
  pre_tokenizer: {
    type: 'Sequence',
    pretokenizers: [
      { type: 'Split', pattern: { Regex: "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    ],
  },
  post_processor: null,
  decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '', fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges },
};
const template = fs.readFileSync(path.join(root, 'tests/data/tokenizer/qwen3_8_style_template.jinja'), 'utf8');
const imEnd = added.find((t) => t.content === '<|im_end|>').id;
const eot = added.find((t) => t.content === '<|endoftext|>').id;
fs.writeFileSync(path.join(out, 'tokenizer.json'), JSON.stringify(tokenizer));
fs.writeFileSync(path.join(out, 'tokenizer_config.json'), JSON.stringify({
  add_bos_token: false, add_eos_token: false, bos_token: null, eos_token: '<|im_end|>', pad_token: '<|endoftext|>',
  model_max_length: 4096, tokenizer_class: 'Qwen2Tokenizer', chat_template: template,
}, null, 1));
fs.writeFileSync(path.join(out, 'generation_config.json'), JSON.stringify({
  eos_token_id: [imEnd, eot], pad_token_id: eot, do_sample: true, temperature: 0.7, top_p: 0.8, top_k: 20,
}, null, 1));
console.log(out);
