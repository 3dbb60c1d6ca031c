// e2e: the official `openai` npm client against `deltaserve serve` on the CPU backend with the
// fixture test model (tests/e2e/make_test_model.mjs). Run by tests/e2e/run_e2e.sh, which sets
// BASE_URL (main server, --max-model-len 1024), LIMITED_URL (1 seq, 1 waiting, API key
// "secret", 2000-byte body limit) and MODEL.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const BASE_URL = process.env.BASE_URL;
const LIMITED_URL = process.env.LIMITED_URL;
const MODEL = process.env.MODEL;
const client = new OpenAI({ baseURL: `${BASE_URL}/v1`, apiKey: 'none', maxRetries: 0 });
const limited = new OpenAI({ baseURL: `${LIMITED_URL}/v1`, apiKey: 'secret', maxRetries: 0 });
const greedy = { model: MODEL, temperature: 0 };
const user = (content) => [{ role: 'user', content }];

async function expectApiError(promise, status, param) {
  try {
    await promise;
  } catch (e) {
    assert.equal(e.status, status, `status ${e.status}: ${e.message}`);
    assert.ok(e.error?.message, 'an OpenAI-style error body with a message');
    assert.ok(e.error?.type, 'error.type');
    if (param) assert.equal(e.error.param, param);
    return e;
  }
  assert.fail(`expected HTTP ${status}`);
}

async function rawPost(url, path, body, headers = {}) {
  const r = await fetch(`${url}${path}`, { method: 'POST', headers: { 'Content-Type': 'application/json', ...headers }, body });
  return { status: r.status, headers: r.headers, json: await r.json().catch(() => null) };
}

async function metric(name) {
  const text = await (await fetch(`${BASE_URL}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(name + ' ') || l.startsWith(name + '{'));
  return line ? Number(line.split(' ').pop()) : NaN;
}

test('models and health', async () => {
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), [MODEL]);
  const h = await fetch(`${BASE_URL}/health`);
  assert.equal(h.status, 200);
});

test('chat completion: schema, usage, greedy determinism, reasoning split', async () => {
  const req = { ...greedy, messages: user('Hello there, how are you?'), max_tokens: 12 };
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  assert.equal(a.object, 'chat.completion');
  assert.equal(a.choices[0].message.role, 'assistant');
  assert.ok(['stop', 'length'].includes(a.choices[0].finish_reason));
  assert.ok(a.usage.prompt_tokens > 0 && a.usage.completion_tokens >= 1 && a.usage.completion_tokens <= 12);
  assert.equal(a.usage.total_tokens, a.usage.prompt_tokens + a.usage.completion_tokens);
  assert.deepEqual(a.choices[0].message, b.choices[0].message);
  // thinking is on by default: the template opens <think>, so the text is reasoning until </think>
  const m = a.choices[0].message;
  assert.ok((m.reasoning_content ?? '').length + (m.content ?? '').length > 0);
  const off = await client.chat.completions.create({ ...req, chat_template_kwargs: { enable_thinking: false } });
  assert.equal(off.choices[0].message.reasoning_content, null);
});

test('seeded sampling is reproducible', async () => {
  const req = { model: MODEL, messages: user('Tell me a story'), max_tokens: 16, temperature: 1.0, top_p: 0.9, seed: 1234, ignore_eos: true };
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  assert.deepEqual(a.choices[0].message, b.choices[0].message);
});

test('completions from token ids and from text', async () => {
  const ids = [10, 20, 30, 40, 50, 60, 70];
  const r = await client.completions.create({ ...greedy, prompt: ids, max_tokens: 6, ignore_eos: true, logprobs: 2 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.usage.prompt_tokens, ids.length);
  assert.equal(r.usage.completion_tokens, 6);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.choices[0].logprobs.token_logprobs.length, 6);
  assert.ok(r.choices[0].logprobs.top_logprobs.every((t) => Object.keys(t).length >= 1));
  const t = await client.completions.create({ ...greedy, prompt: 'The quick brown fox', max_tokens: 4, ignore_eos: true });
  assert.equal(t.usage.completion_tokens, 4);
});

test('streaming equals non-streaming, with include_usage', async () => {
  const req = { ...greedy, messages: user('Count to ten'), max_tokens: 20, ignore_eos: true, chat_template_kwargs: { enable_thinking: false } };
  const full = await client.chat.completions.create(req);
  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let usage = null;
  let finish = null;
  let n = 0;
  for await (const chunk of stream) {
    n++;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta?.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.ok(n >= 3);
  assert.equal(text, full.choices[0].message.content);
  assert.equal(finish, 'length');
  assert.deepEqual(usage, full.usage);
});

test('stop strings are never emitted, also across token boundaries when streaming', async () => {
  const base = { ...greedy, prompt: [5, 6, 7, 8, 9], max_tokens: 24, ignore_eos: true };
  const full = (await client.completions.create(base)).choices[0].text;
  const chars = [...full];
  assert.ok(chars.length >= 8, `need a longer text: ${JSON.stringify(full)}`);
  const stop = chars.slice(4, 7).join('');
  const expected = full.slice(0, full.indexOf(stop));
  const r = await client.completions.create({ ...base, stop: [stop] });
  assert.equal(r.choices[0].text, expected);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await client.completions.create({ ...base, stop, stream: true });
  let text = '';
  for await (const c of s) text += c.choices[0]?.text ?? '';
  assert.equal(text, expected);
});

test('chat logprobs', async () => {
  const r = await client.chat.completions.create({ ...greedy, messages: user('hi'), max_tokens: 5, ignore_eos: true, logprobs: true, top_logprobs: 3 });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, 5);
  for (const e of lp) {
    assert.equal(e.top_logprobs.length, 3);
    assert.ok(e.logprob <= 0 && e.top_logprobs[0].logprob >= e.logprob);
  }
});

test('tool-call round trip: tools in the prompt, assistant tool_calls and tool results accepted', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] } } }];
  const messages = user('What is the weather in Paris?');
  const plain = await client.chat.completions.create({ ...greedy, messages, max_tokens: 4 });
  const first = await client.chat.completions.create({ ...greedy, messages, tools, tool_choice: 'auto', max_tokens: 8 });
  assert.ok(first.usage.prompt_tokens > plain.usage.prompt_tokens, 'the tools are rendered into the prompt');
  assert.ok(['stop', 'length', 'tool_calls'].includes(first.choices[0].finish_reason));
  const followup = [
    ...messages,
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris", "days": 2}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c": 21}' },
  ];
  const second = await client.chat.completions.create({ ...greedy, messages: followup, tools, max_tokens: 8 });
  assert.equal(second.choices[0].message.role, 'assistant');
  assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens);
  const none = await client.chat.completions.create({ ...greedy, messages, tools, tool_choice: 'none', max_tokens: 4 });
  assert.equal(none.usage.prompt_tokens, plain.usage.prompt_tokens);
});

const weatherTools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } },
];
const noThinking = { chat_template_kwargs: { enable_thinking: false } };
// Ids in the test model's vocabulary (make_test_model.mjs: 256 bytes, merges, then the specials).
const THINK_CLOSE_ID = 347;  // "</think>"
const BYTE = (c) => c.charCodeAt(0);

function expectCall(choice, names) {
  const calls = choice.message.tool_calls;
  assert.ok(calls?.length >= 1, `a tool call, got ${JSON.stringify(choice.message)}`);
  assert.ok(names.includes(calls[0].function.name), calls[0].function.name);
  assert.equal(typeof JSON.parse(calls[0].function.arguments), 'object');
  assert.match(calls[0].id, /^call_/);
  assert.ok(['tool_calls', 'length'].includes(choice.finish_reason));
  return calls[0];
}

test('tool_choice required and named: the output is a call, and the call round-trips', async () => {
  const messages = user('What is the weather in Paris?');
  const base = { ...greedy, messages, tools: weatherTools, max_tokens: 24, ...noThinking };
  expectCall((await client.chat.completions.create({ ...base, tool_choice: 'required' })).choices[0], ['get_weather', 'get_time']);
  const named = await client.chat.completions.create({ ...base, tool_choice: { type: 'function', function: { name: 'get_weather' } } });
  const call = expectCall(named.choices[0], ['get_weather']);
  const followup = [...messages, { role: 'assistant', content: null, tool_calls: [call] },
    { role: 'tool', tool_call_id: call.id, content: '{"temp_c": 21}' }];
  const next = await client.chat.completions.create({ ...greedy, messages: followup, tools: weatherTools, max_tokens: 4 });
  assert.equal(next.choices[0].message.role, 'assistant');
  // with thinking on, the call is forced only after the model's own </think> (biased here so
  // this random-weight model closes its thinking at once)
  const thinking = await client.chat.completions.create({ ...greedy, messages, tools: weatherTools, max_tokens: 32,
    tool_choice: { type: 'function', function: { name: 'get_time' } }, logit_bias: { [THINK_CLOSE_ID]: 100 } });
  expectCall(thinking.choices[0], ['get_time']);
});

test('response_format json_object / json_schema: constrained output parses', async () => {
  // the bias pulls towards a closing bracket; the constraint keeps it from coming too early
  const obj = await client.chat.completions.create({ ...greedy, ...noThinking, messages: user('Reply in JSON'), max_tokens: 64,
    response_format: { type: 'json_object' }, logit_bias: { [BYTE('}')]: 30, [BYTE('"')]: 20 } });
  assert.equal(obj.choices[0].finish_reason, 'stop');
  const v = JSON.parse(obj.choices[0].message.content);
  assert.ok(v && typeof v === 'object' && !Array.isArray(v), obj.choices[0].message.content);
  const arr = await client.chat.completions.create({ ...greedy, ...noThinking, messages: user('A list'), max_tokens: 64,
    response_format: { type: 'json_schema', json_schema: { name: 'list', schema: { type: 'array' } } }, logit_bias: { [BYTE(']')]: 30 } });
  assert.ok(Array.isArray(JSON.parse(arr.choices[0].message.content)));
  // a schema with required keys, a string enum and an integer: the only values it allows
  const unitSchema = { type: 'object', additionalProperties: false, required: ['unit', 'n'],
    properties: { unit: { enum: ['C', 'F'] }, n: { type: 'integer' } } };
  const typed = await client.chat.completions.create({ ...greedy, ...noThinking, messages: user('Units'), max_tokens: 300,
    response_format: { type: 'json_schema', json_schema: { name: 'unit', schema: unitSchema } },
    logit_bias: { [BYTE('}')]: 30, [BYTE(',')]: 20, [BYTE('"')]: 20 } });
  assert.equal(typed.choices[0].finish_reason, 'stop', typed.choices[0].message.content);
  const u = JSON.parse(typed.choices[0].message.content);
  assert.deepEqual(Object.keys(u).sort(), ['n', 'unit'], typed.choices[0].message.content);
  assert.ok(['C', 'F'].includes(u.unit) && Number.isInteger(u.n), typed.choices[0].message.content);
  // sampled, unbiased: whatever comes is a JSON object or, cut by max_tokens, its beginning
  const sampled = await client.chat.completions.create({ model: MODEL, temperature: 1, seed: 7, ...noThinking, messages: user('JSON'),
    max_tokens: 48, response_format: { type: 'json_object' } });
  const text = sampled.choices[0].message.content;
  assert.match(text, /^\s*\{/);
  if (sampled.choices[0].finish_reason === 'stop') JSON.parse(text);
  // completions take it too
  const c = await client.completions.create({ ...greedy, prompt: 'data:', max_tokens: 40, response_format: { type: 'json_object' },
    logit_bias: { [BYTE('}')]: 30 } });
  assert.equal(typeof JSON.parse(c.choices[0].text), 'object');
});

test('streamed tool calls accumulate into the non-streamed ones', async () => {
  for (const tool_choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
    const req = { ...greedy, ...noThinking, messages: user('Weather in Oslo?'), tools: weatherTools, tool_choice, max_tokens: 24 };
    const whole = await client.chat.completions.create(req);
    const stream = client.beta.chat.completions.stream(req);
    let first = null;
    for await (const chunk of stream) {
      const tc = chunk.choices[0]?.delta?.tool_calls;
      if (tc && !first) first = tc[0];
    }
    const streamed = await stream.finalChatCompletion();
    assert.ok(first.id && first.function.name && first.type === 'function', 'the first delta names the call');
    const strip = (calls) => calls.map((c) => ({ type: c.type, name: c.function.name, arguments: c.function.arguments }));
    assert.deepEqual(strip(streamed.choices[0].message.tool_calls), strip(whole.choices[0].message.tool_calls));
    assert.equal(streamed.choices[0].finish_reason, whole.choices[0].finish_reason);
    assert.equal(streamed.choices[0].message.content ?? '', whole.choices[0].message.content ?? '');
  }
});

test('per-request timeout: the output so far, finish_reason length, stop_reason timeout', async () => {
  const req = { ...greedy, prompt: [1, 2, 3], max_tokens: 1000, ignore_eos: true, timeout: 0.1 };
  const t0 = Date.now();
  const r = await client.completions.create(req);
  assert.ok(Date.now() - t0 < 5000, 'ended near its deadline');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.choices[0].stop_reason, 'timeout');
  assert.ok(r.usage.completion_tokens < 1000);
  let last = null;
  for await (const chunk of await client.completions.create({ ...req, stream: true })) last = chunk;
  assert.equal(last.choices[0].finish_reason, 'length');
  assert.equal(last.choices[0].stop_reason, 'timeout');
  // a longer timeout than the server's is capped, not refused; a short request is unaffected
  const quick = await client.completions.create({ ...req, max_tokens: 3, timeout: 1e6 });
  assert.equal(quick.choices[0].finish_reason, 'length');
  assert.equal(quick.choices[0].stop_reason, undefined);
});

test('bad input: clear 4xx with an OpenAI error body', async () => {
  const mal = await rawPost(BASE_URL, '/v1/chat/completions', '{"model": ');
  assert.equal(mal.status, 400);
  assert.match(mal.json.error.message, /JSON/);
  const utf8 = await fetch(`${BASE_URL}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: Buffer.concat([Buffer.from(`{"model": "${MODEL}", "prompt": "ab`), Buffer.from([0xff, 0xfe]), Buffer.from('"}')]) });
  assert.equal(utf8.status, 400);
  assert.ok((await utf8.json()).error.message);
  const deep = await rawPost(BASE_URL, '/v1/completions', `{"model": "${MODEL}", "prompt": ${'['.repeat(100000)}${']'.repeat(100000)}}`);
  assert.equal(deep.status, 400);
  assert.match(deep.json.error.message, /nests/);
  const form = await fetch(`${BASE_URL}/v1/completions`, { method: 'POST', headers: { 'Content-Type': 'application/x-www-form-urlencoded' },
    body: JSON.stringify({ model: MODEL, prompt: [1, 2, 3], max_tokens: 1, user: 'x'.repeat(9000) }) });  // curl -d without a content type
  assert.equal(form.status, 200);
  await expectApiError(client.chat.completions.create({ ...greedy, messages: user('hi'), temperature: 'hot' }), 400, 'temperature');
  await expectApiError(client.chat.completions.create({ ...greedy, messages: 'hi' }), 400, 'messages');
  await expectApiError(client.chat.completions.create({ ...greedy, messages: [{ role: 'user', content: 5 }] }), 400, 'messages');
  await expectApiError(client.chat.completions.create({ ...greedy, messages: [] }), 400, 'messages');
  await expectApiError(client.chat.completions.create({ ...greedy, model: 'no-such-model', messages: user('hi') }), 404, 'model');
  await expectApiError(client.chat.completions.create({ ...greedy, messages: user('hi'), n: 2 }), 400, 'n');
  await expectApiError(client.chat.completions.create({ ...greedy, messages: user('hi'), tool_choice: 'required' }), 400, 'tool_choice');
  await expectApiError(client.chat.completions.create({ ...greedy, messages: user('hi'), tools: [{ type: 'function', function: { name: 'f' } }],
    tool_choice: { type: 'function', function: { name: 'g' } } }), 400, 'tool_choice');
  await expectApiError(client.chat.completions.create({ ...greedy, messages: user('hi'), response_format: { type: 'xml' } }), 400, 'response_format');
  const schema = await expectApiError(client.chat.completions.create({ ...greedy, messages: user('hi'),
    response_format: { type: 'json_schema', json_schema: { name: 's', schema: { type: 'object', properties: { a: { type: 'string', pattern: '^x' } } } } } }), 400, 'response_format');
  assert.match(schema.error.message, /'pattern'/, 'an unenforced schema keyword is named, never ignored');
  assert.match(schema.error.message, /properties\.a\./, 'with its path');
  await expectApiError(client.chat.completions.create({ ...greedy, messages: user('hi'), timeout: -1 }), 400, 'timeout');
  await expectApiError(client.completions.create({ ...greedy, prompt: Array(1100).fill(7), max_tokens: 1 }), 400);
  const over = await expectApiError(client.completions.create({ ...greedy, prompt: [1, 2, 3], max_tokens: 1022 }), 400, 'max_tokens');
  assert.equal(over.error.code, 'context_length_exceeded');
  await expectApiError(client.completions.create({ ...greedy, prompt: [1, 99999], max_tokens: 2 }), 400, 'prompt');
  await expectApiError(client.completions.create({ ...greedy, prompt: { a: 1 }, max_tokens: 2 }), 400, 'prompt');
  await expectApiError(client.chat.completions.create({ ...greedy, messages: user('hi'), max_tokens: -1 }), 400, 'max_tokens');
  // the server is still healthy and serving
  const ok = await client.completions.create({ ...greedy, prompt: [1, 2, 3], max_tokens: 2 });
  assert.equal(ok.choices.length, 1);
});

test('fuzzed request bodies never crash the server or get a 5xx', async () => {
  let seed = 12345;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
  const pick = (a) => a[Math.floor(rnd() * a.length)];
  const vals = [null, true, false, 0, -1, 1.5, 1e300, '', 'x', '<think>', '<tool_call>', [], {}, [1], { a: 1 }, [[1]], 2 ** 63, -(2 ** 63), '\u0000'];
  const fields = ['model', 'messages', 'prompt', 'max_tokens', 'temperature', 'top_p', 'top_k', 'min_p', 'seed', 'stop', 'stream',
    'stream_options', 'logprobs', 'top_logprobs', 'tools', 'tool_choice', 'chat_template_kwargs', 'n', 'logit_bias', 'stop_token_ids',
    'presence_penalty', 'repetition_penalty', 'ignore_eos', 'max_completion_tokens', 'response_format', 'echo', 'min_tokens', 'timeout'];
  for (let i = 0; i < 200; i++) {
    const chat = rnd() < 0.5;
    const body = chat ? { model: MODEL, messages: user('hi'), max_tokens: 3 } : { model: MODEL, prompt: [1, 2, 3], max_tokens: 3 };
    for (let k = 1 + Math.floor(rnd() * 3); k > 0; k--) body[pick(fields)] = pick(vals);
    if (chat && rnd() < 0.4) {
      const m = { role: pick(['user', 'assistant', 'tool', 'system', 'x', 3]), content: pick(vals) };
      if (rnd() < 0.5) m.tool_calls = pick([[{ function: { name: 'f', arguments: pick(vals) } }], 1.5, [{}]]);
      body.messages = [m];
    }
    let text = JSON.stringify(body);
    if (rnd() < 0.1) text = text.slice(0, Math.floor(rnd() * text.length));
    const r = await fetch(`${BASE_URL}${chat ? '/v1/chat/completions' : '/v1/completions'}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: text });
    const raw = await r.text();
    assert.ok(r.status < 500, `HTTP ${r.status} for ${text.slice(0, 200)}: ${raw.slice(0, 200)}`);
    if (r.status >= 400) assert.ok(JSON.parse(raw).error.message, raw);
  }
  assert.equal((await fetch(`${BASE_URL}/health`)).status, 200);
});

test('a client disconnect mid-stream frees its slot (metrics)', async () => {
  const cancelledBefore = await metric('deltaserve_requests_finished_total{reason="cancelled"}');
  const ac = new AbortController();
  const stream = await client.completions.create({ ...greedy, prompt: [3, 4, 5], max_tokens: 240, ignore_eos: true, stream: true }, { signal: ac.signal });
  let n = 0;
  try {
    for await (const c of stream) {
      if (++n === 3) ac.abort();
    }
  } catch (e) {
    assert.ok(ac.signal.aborted, `unexpected stream error: ${e}`);
  }
  let used = 1;
  for (let i = 0; i < 100 && used !== 0; i++) {
    await new Promise((r) => setTimeout(r, 50));
    used = await metric('deltaserve_state_slots_used');
  }
  assert.equal(used, 0);
  assert.equal(await metric('deltaserve_kv_blocks_used'), 0);
  assert.ok((await metric('deltaserve_requests_finished_total{reason="cancelled"}')) > cancelledBefore);
});

test('metrics: Prometheus text with counters and histograms', async () => {
  const text = await (await fetch(`${BASE_URL}/metrics`)).text();
  for (const name of ['deltaserve_requests_running', 'deltaserve_requests_waiting', 'deltaserve_prompt_tokens_total',
    'deltaserve_generation_tokens_total', 'deltaserve_preemptions_total', 'deltaserve_kv_cache_usage',
    'deltaserve_state_slots_used', 'deltaserve_time_to_first_token_seconds_bucket', 'deltaserve_time_per_output_token_seconds_count'])
    assert.ok(text.includes(name), name);
  assert.ok((await metric('deltaserve_generation_tokens_total')) > 0);
});

test('api key, body limit and overload on the limited server', async () => {
  const noKey = new OpenAI({ baseURL: `${LIMITED_URL}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await expectApiError(noKey.models.list(), 401);
  const big = await rawPost(LIMITED_URL, '/v1/completions', JSON.stringify({ model: MODEL, prompt: 'x'.repeat(5000) }), { Authorization: 'Bearer secret' });
  assert.equal(big.status, 413);
  assert.ok(big.json.error.message);
  // one running + one waiting; the rest are turned away with 429 and Retry-After
  const acs = [];
  const long = () => {
    const ac = new AbortController();
    acs.push(ac);
    return limited.completions.create({ model: MODEL, prompt: [1, 2], max_tokens: 3000, ignore_eos: true, temperature: 0 }, { signal: ac.signal }).catch((e) => e);
  };
  const running = [long(), long()];
  let full = false;
  for (let i = 0; i < 400 && !full; i++) {  // until one runs and one waits
    const m = await (await fetch(`${LIMITED_URL}/metrics`)).text();
    full = /deltaserve_requests_running 1\n/.test(m) && /deltaserve_requests_waiting 1\n/.test(m);
    if (!full) await new Promise((r) => setTimeout(r, 50));
  }
  assert.ok(full, 'one request running and one waiting on the limited server');
  const r = await rawPost(LIMITED_URL, '/v1/completions', JSON.stringify({ model: MODEL, prompt: [1, 2], max_tokens: 4 }), { Authorization: 'Bearer secret' });
  assert.equal(r.status, 429);
  assert.ok(r.headers.get('retry-after'));
  assert.equal(r.json.error.type, 'rate_limit_error');
  for (const ac of acs) ac.abort();
  await Promise.all(running);
});
