// The serving issue's "Done when": 64 concurrent streaming clients through the `openai`
// package, each with its own prompt (16 distinct prompts of 1 to ~300 tokens, four sharing a
// long prefix so the prefix cache is hit), greedy with ignore_eos and a fixed max_tokens, each
// receive exactly the text pdserve-generate prints for that prompt. A small per-step token
// budget forces chunked prefill mixed with decodes. Afterwards no KV block is left in use.
import assert from "node:assert/strict";

import { generateGreedy, makeClient, makeModel, runChecks, setDeadline, startServer,
         withTimeout } from "./harness.mjs";

setDeadline(170);

const CLIENTS = 64;
const MAX_TOKENS = 32;

function buildPrompts() {
  const words = ["cache", "block", "prefill", "decode", "token", "stream", "batch", "queue", "ünïcödé",
                 "北京", "42", "serving", "latency", "throughput", "scheduler", "kernel"];
  const sharedPrefix = "You are a careful assistant. Answer briefly and precisely. ".repeat(6);
  const prompts = ["Hi", "The quick brown fox jumps", "1 2 3 4 5 6 7 8 9", "¿Qué tal? 你好！"];
  for (let i = 0; i < 4; ++i) prompts.push(`${sharedPrefix}Question ${i}: what is a ${words[i]}?`);
  for (let i = 0; i < 8; ++i) {
    const length = 4 + i * i * 4;  // 4 to 200 words
    prompts.push(Array.from({ length }, (_, k) => words[(k * (i + 3) + i) % words.length]).join(" "));
  }
  return prompts;
}

const prompts = buildPrompts();
const modelDir = await makeModel();
// Two pdserve-generate runs at a time: the machine has two cores.
const expected = [];
for (let i = 0; i < prompts.length; i += 2) {
  expected.push(...await Promise.all(prompts.slice(i, i + 2).map((p) => generateGreedy(modelDir, p, MAX_TOKENS))));
}
const server = await startServer(modelDir, ["--max-num-batched-tokens", "256", "--max-num-seqs", "64"]);
const client = makeClient(server);

async function metric(name) {
  const response = await withTimeout(fetch(`${server.url}/metrics`), 10, "GET /metrics");
  const line = (await response.text()).split("\n").find((l) => l.startsWith(`${name} `));
  assert.ok(line, `${name} is not in /metrics`);
  return Number(line.slice(name.length + 1));
}

async function streamOne(clientIndex) {
  const prompt = prompts[clientIndex % prompts.length];
  const stream = await client.completions.create({
    model: server.name, prompt, max_tokens: MAX_TOKENS, temperature: 0, ignore_eos: true, stream: true,
    stream_options: { include_usage: true } });
  let text = "";
  let finishReason = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      text += choice.text;
      finishReason = choice.finish_reason ?? finishReason;
    }
  }
  return { clientIndex, text, finishReason, usage };
}

const failed = await runChecks([
  [`${CLIENTS} concurrent streams each equal pdserve-generate for their prompt`, async () => {
    let peakRunning = 0;
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        peakRunning = Math.max(peakRunning, await metric("pdserve:num_requests_running"));
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    })();
    const start = Date.now();
    const results = await withTimeout(
      Promise.all(Array.from({ length: CLIENTS }, (_, i) => streamOne(i))), 120, "the concurrent streams");
    const seconds = (Date.now() - start) / 1000;
    sampling = false;
    await sampler;
    const mismatches = results.filter((r) => r.text !== expected[r.clientIndex % prompts.length]);
    for (const r of mismatches.slice(0, 4)) {
      console.log(`client ${r.clientIndex}: got ${JSON.stringify(r.text)}\n` +
                  `   expected ${JSON.stringify(expected[r.clientIndex % prompts.length])}`);
    }
    assert.equal(mismatches.length, 0, `${mismatches.length} of ${CLIENTS} streams differ from pdserve-generate`);
    for (const r of results) {
      assert.equal(r.finishReason, "length", `client ${r.clientIndex}`);
      assert.equal(r.usage?.completion_tokens, MAX_TOKENS, `client ${r.clientIndex} usage`);
    }
    console.log(`     ${CLIENTS * MAX_TOKENS} tokens in ${seconds.toFixed(2)} s ` +
                `(${(CLIENTS * MAX_TOKENS / seconds).toFixed(0)} tokens/s), peak running ${peakRunning}`);
    assert.ok(peakRunning > 1, "the streams were never batched together");
  }],

  ["the shared prefix hit the prefix cache", async () => {
    assert.ok(await metric("pdserve:prefix_cache_hits_total") > 0);
  }],

  ["once idle, no KV block is in use", async () => {
    let usage = 1;
    for (const end = Date.now() + 10_000; Date.now() < end;) {
      usage = await metric("pdserve:kv_cache_blocks_used");
      if (usage === 0) break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    assert.equal(usage, 0, "KV blocks in use");
    assert.equal(await metric("pdserve:kv_cache_usage_perc"), 0);
    assert.equal(await metric("pdserve:num_requests_running"), 0);
    assert.equal(await metric("pdserve:num_requests_waiting"), 0);
  }],
]);

const exitCode = await server.stop();
if (failed > 0 || exitCode !== 0) {
  console.log(`${failed} check(s) failed, server exit code ${exitCode}; server stderr:\n${server.stderr()}`);
  process.exit(1);
}
console.log("all concurrent stream checks passed");
