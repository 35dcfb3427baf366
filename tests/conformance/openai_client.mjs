// Conformance of pdserve-decode with the official `openai` npm client: completions and chat,
// streaming and not, stop strings, usage (stream_options.include_usage), n, echo, token-id and
// list prompts, logprobs (checked by their properties: no oracle holds the tiny model's
// probabilities), /v1/models, errors as openai.APIError, and a clean SIGTERM with a
// stream in flight. Greedy texts are checked against pdserve-generate (no batching, no
// scheduler, no HTTP) on the same checkpoint.
import assert from "node:assert/strict";

import { generateGreedy, makeClient, makeModel, openai, runChecks, setDeadline, startServer,
         withTimeout } from "./harness.mjs";

setDeadline(150);

const MAX_TOKENS = 24;
const PROMPT = "The quick brown fox jumps";
const OTHER_PROMPT = "Hello";
const PROMPT_IDS = [1000, 2000, 3000, 4000, 5000, 6000, 7];
const CHAT_QUESTION = "Hi there";
const greedy = { max_tokens: MAX_TOKENS, temperature: 0, ignore_eos: true };
// Qwen3's template defaults to thinking; pdserve-generate --chat defaults to not thinking.
const noThinking = { chat_template_kwargs: { enable_thinking: false } };

const modelDir = await makeModel();
const SYSTEM = "You are terse.";
const [expected, expectedOther, expectedFromIds, expectedChat] = await Promise.all([
  generateGreedy(modelDir, PROMPT, MAX_TOKENS),
  generateGreedy(modelDir, OTHER_PROMPT, MAX_TOKENS),
  generateGreedy(modelDir, PROMPT_IDS, MAX_TOKENS),
  generateGreedy(modelDir, CHAT_QUESTION, MAX_TOKENS, ["--chat"]),
]);
const expectedThinking = await generateGreedy(modelDir, CHAT_QUESTION, MAX_TOKENS,
                                              ["--chat", "--enable-thinking", "--system", SYSTEM]);
const server = await startServer(modelDir);
const client = makeClient(server);
const model = server.name;
const chatMessages = [{ role: "user", content: CHAT_QUESTION }];

// Reads a stream to its end (the client stops at `data: [DONE]`), with a deadline.
async function collect(stream) {
  const chunks = [];
  await withTimeout((async () => {
    for await (const chunk of stream) chunks.push(chunk);
  })(), 60, "stream");
  return chunks;
}

function checkUsage(usage, promptTokens, completionTokens) {
  assert.ok(usage, "usage is missing");
  if (promptTokens !== undefined) assert.equal(usage.prompt_tokens, promptTokens, "prompt_tokens");
  assert.ok(usage.prompt_tokens > 0, "prompt_tokens > 0");
  assert.equal(usage.completion_tokens, completionTokens, "completion_tokens");
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens, "total_tokens");
}

// The token counts of a usage object; its pdserve_timeline extension (per-request timings, so
// different for every request) is checked for shape and left out.
function usageCounts(usage, completionTokens) {
  assert.ok(usage, "usage is missing");
  const { pdserve_timeline: timeline, ...counts } = usage;
  assert.ok(timeline && Array.isArray(timeline.spans), "usage.pdserve_timeline with its spans");
  assert.equal(timeline.tokens_ms.length, completionTokens, "pdserve_timeline.tokens_ms: one per token of choice 0");
  assert.ok(timeline.ttft_ms >= 0 && timeline.ttft_ms <= timeline.e2e_ms, "pdserve_timeline: 0 <= ttft_ms <= e2e_ms");
  return counts;
}

// Completion chunks: text per choice index, the finish reasons, and the usage-only last chunk.
function splitCompletionStream(chunks) {
  const texts = [];
  const finishReasons = [];
  let usage = null;
  const id = chunks[0].id;
  chunks.forEach((chunk, position) => {
    assert.equal(chunk.object, "text_completion");
    assert.equal(chunk.id, id, "every chunk carries the same id");
    assert.equal(chunk.model, model);
    if (chunk.usage) {
      assert.equal(position, chunks.length - 1, "usage comes in the last chunk");
      assert.deepEqual(chunk.choices, [], "the usage chunk has no choices");
      usage = chunk.usage;
      return;
    }
    for (const choice of chunk.choices) {
      assert.equal(finishReasons[choice.index], undefined, `choice ${choice.index} went on after its finish`);
      texts[choice.index] = (texts[choice.index] ?? "") + choice.text;
      if (choice.finish_reason) finishReasons[choice.index] = choice.finish_reason;
    }
  });
  return { texts, finishReasons, usage };
}

function splitChatStream(chunks) {
  const contents = [];
  const finishReasons = [];
  const roles = [];
  let usage = null;
  chunks.forEach((chunk, position) => {
    assert.equal(chunk.object, "chat.completion.chunk");
    if (chunk.usage) {
      assert.equal(position, chunks.length - 1, "usage comes in the last chunk");
      assert.deepEqual(chunk.choices, []);
      usage = chunk.usage;
      return;
    }
    for (const choice of chunk.choices) {
      assert.equal(finishReasons[choice.index], undefined, `choice ${choice.index} went on after its finish`);
      if (choice.delta.role) roles[choice.index] = choice.delta.role;
      contents[choice.index] = (contents[choice.index] ?? "") + (choice.delta.content ?? "");
      if (choice.finish_reason) finishReasons[choice.index] = choice.finish_reason;
    }
  });
  return { contents, finishReasons, roles, usage };
}

// A stop string taken from the middle of the greedy text: four ASCII letters or digits, so
// that the expected output (the text before its first occurrence) is unambiguous.
function pickStopString(text) {
  const match = /[A-Za-z0-9]{4}/.exec(text.slice(8));
  assert.ok(match, `no ASCII run to stop at in ${JSON.stringify(text)}`);
  const stop = match[0];
  return { stop, before: text.slice(0, text.indexOf(stop)) };
}

// A token string as bytes: OpenAI spells a token that is not valid UTF-8 on its own (part of
// a character) "bytes:\xe4\xbd".
function tokenBytes(token) {
  if (!token.startsWith("bytes:")) return Buffer.from(token, "utf8");
  const hex = token.slice("bytes:".length);
  assert.match(hex, /^(\\x[0-9a-f]{2})+$/, `malformed byte token ${token}`);
  return Buffer.from(hex.replaceAll("\\x", ""), "hex");
}

function checkLogprob(value, what) {
  assert.equal(typeof value, "number", what);
  assert.ok(Number.isFinite(value) && value <= 0, `${what} = ${value}`);
}

// {tokens, token_logprobs, top_logprobs, text_offset} of a greedy completion without echo.
function checkCompletionLogprobs(logprobs, text, completionTokens, topK) {
  assert.ok(logprobs, "logprobs were asked for");
  const { tokens, token_logprobs: values, top_logprobs: tops, text_offset: offsets } = logprobs;
  for (const list of [tokens, values, tops, offsets]) assert.equal(list.length, completionTokens);
  assert.equal(Buffer.concat(tokens.map(tokenBytes)).toString("utf8"), text, "the tokens spell the text");
  assert.equal(offsets[0], 0);
  tokens.forEach((token, i) => {
    checkLogprob(values[i], `token_logprobs[${i}]`);
    if (i > 0) assert.ok(offsets[i] >= offsets[i - 1], "text_offset never decreases");
    const alternatives = Object.entries(tops[i]);
    assert.ok(alternatives.length >= 1 && alternatives.length <= topK + 1, `top_logprobs[${i}] size`);
    for (const [name, value] of alternatives) checkLogprob(value, `top_logprobs[${i}][${name}]`);
    const best = Math.max(...alternatives.map(([, value]) => value));
    assert.ok(Math.abs(values[i] - best) < 1e-5, `greedy token ${i} is not the most likely one`);
    assert.ok(Math.abs(tops[i][token] - values[i]) < 1e-5, `token ${i} is missing from its top_logprobs`);
  });
  assert.ok(offsets.at(-1) < [...text].length, "text_offset stays inside the text");
}

// Chat logprobs.content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}].
function checkChatLogprobs(content, text, completionTokens, topK) {
  assert.ok(Array.isArray(content), "logprobs.content was asked for");
  assert.equal(content.length, completionTokens);
  for (const entry of content) {
    checkLogprob(entry.logprob, `logprob of ${entry.token}`);
    assert.deepEqual(Buffer.from(entry.bytes), tokenBytes(entry.token), "bytes match the token");
    assert.equal(entry.top_logprobs.length, topK);
    entry.top_logprobs.forEach((top, i) => {
      checkLogprob(top.logprob, "top logprob");
      assert.deepEqual(Buffer.from(top.bytes), tokenBytes(top.token));
      if (i > 0) assert.ok(top.logprob <= entry.top_logprobs[i - 1].logprob, "top_logprobs are sorted");
    });
    assert.equal(entry.top_logprobs[0].token, entry.token, "greedy picks the most likely token");
    assert.ok(Math.abs(entry.top_logprobs[0].logprob - entry.logprob) < 1e-5);
  }
  assert.equal(Buffer.concat(content.map((entry) => Buffer.from(entry.bytes))).toString("utf8"), text,
               "the bytes spell the content");
}

async function expectApiError(request, status, fields) {
  let error = null;
  try {
    await request();
  } catch (caught) {
    error = caught;
  }
  assert.ok(error instanceof openai.APIError, `expected an openai.APIError, got ${error}`);
  assert.equal(error.status, status, `status of ${error.message}`);
  assert.equal(typeof error.error?.message, "string", "error.message");
  assert.ok(error.error.message.length > 0);
  for (const key of ["type", "param", "code"]) {
    assert.ok(key in error.error, `the error body has no '${key}'`);
  }
  for (const [key, value] of Object.entries(fields)) assert.equal(error[key], value, key);
  return error;
}

const failed = await runChecks([
  ["GET /v1/models lists the served model", async () => {
    const page = await client.models.list();
    assert.equal(page.data.length, 1);
    assert.equal(page.data[0].id, model);
    assert.equal(page.data[0].object, "model");
    assert.equal(typeof page.data[0].created, "number");
  }],

  ["completion equals pdserve-generate", async () => {
    const response = await client.completions.create({ model, prompt: PROMPT, ...greedy });
    assert.equal(response.object, "text_completion");
    assert.match(response.id, /^cmpl-/);
    assert.equal(response.model, model);
    assert.equal(response.choices.length, 1);
    assert.equal(response.choices[0].index, 0);
    assert.equal(response.choices[0].text, expected);
    assert.equal(response.choices[0].finish_reason, "length");
    checkUsage(response.usage, undefined, MAX_TOKENS);
  }],

  ["streamed completion equals pdserve-generate, usage matches the unstreamed one", async () => {
    const plain = await client.completions.create({ model, prompt: PROMPT, ...greedy });
    const chunks = await collect(await client.completions.create({
      model, prompt: PROMPT, ...greedy, stream: true, stream_options: { include_usage: true } }));
    const { texts, finishReasons, usage } = splitCompletionStream(chunks);
    assert.deepEqual(texts, [expected]);
    assert.deepEqual(finishReasons, ["length"]);
    assert.deepEqual(usageCounts(usage, MAX_TOKENS), usageCounts(plain.usage, MAX_TOKENS));
  }],

  ["stream without include_usage sends no usage", async () => {
    const chunks = await collect(await client.completions.create({ model, prompt: PROMPT, ...greedy, stream: true }));
    assert.ok(chunks.every((chunk) => !chunk.usage), "a chunk carries usage");
    assert.deepEqual(splitCompletionStream(chunks).texts, [expected]);
  }],

  ["prompt as token ids: usage counts them, text equals pdserve-generate --prompt-ids", async () => {
    const response = await client.completions.create({ model, prompt: PROMPT_IDS, ...greedy });
    assert.equal(response.choices[0].text, expectedFromIds);
    checkUsage(response.usage, PROMPT_IDS.length, MAX_TOKENS);
  }],

  ["a list of prompts gets one choice each, in order", async () => {
    const single = await client.completions.create({ model, prompt: OTHER_PROMPT, ...greedy });
    const both = await client.completions.create({ model, prompt: [PROMPT, OTHER_PROMPT], ...greedy });
    assert.deepEqual(both.choices.map((choice) => [choice.index, choice.text]),
                     [[0, expected], [1, expectedOther]]);
    const first = await client.completions.create({ model, prompt: PROMPT, ...greedy });
    checkUsage(both.usage, first.usage.prompt_tokens + single.usage.prompt_tokens, 2 * MAX_TOKENS);
  }],

  ["chat equals pdserve-generate --chat", async () => {
    const response = await client.chat.completions.create({ model, messages: chatMessages, ...greedy, ...noThinking });
    assert.equal(response.object, "chat.completion");
    assert.match(response.id, /^chatcmpl-/);
    assert.equal(response.choices.length, 1);
    assert.equal(response.choices[0].message.role, "assistant");
    assert.equal(response.choices[0].message.content, expectedChat);
    assert.equal(response.choices[0].finish_reason, "length");
    checkUsage(response.usage, undefined, MAX_TOKENS);
  }],

  // The random model never writes </think>, so all of its text is content.
  ["chat with a system message, thinking on by default: equals pdserve-generate --enable-thinking", async () => {
    const response = await client.chat.completions.create({
      model, messages: [{ role: "system", content: SYSTEM }, ...chatMessages], ...greedy });
    assert.equal(response.choices[0].message.content, expectedThinking);
  }],

  ["streamed chat: role first, content equals pdserve-generate --chat, usage", async () => {
    const plain = await client.chat.completions.create({ model, messages: chatMessages, ...greedy, ...noThinking });
    const chunks = await collect(await client.chat.completions.create({
      model, messages: chatMessages, ...greedy, ...noThinking, stream: true,
      stream_options: { include_usage: true } }));
    assert.equal(chunks[0].choices[0].delta.role, "assistant", "the first chunk names the role");
    const { contents, finishReasons, roles, usage } = splitChatStream(chunks);
    assert.deepEqual(roles, ["assistant"]);
    assert.deepEqual(contents, [expectedChat]);
    assert.deepEqual(finishReasons, ["length"]);
    assert.deepEqual(usageCounts(usage, MAX_TOKENS), usageCounts(plain.usage, MAX_TOKENS));
  }],

  ["completion stop string: cut before it, finish_reason stop", async () => {
    const { stop, before } = pickStopString(expected);
    const response = await client.completions.create({ model, prompt: PROMPT, ...greedy, stop: [stop, "never-seen"] });
    assert.equal(response.choices[0].text, before);
    assert.ok(!response.choices[0].text.includes(stop));
    assert.equal(response.choices[0].finish_reason, "stop");
    assert.ok(response.usage.completion_tokens < MAX_TOKENS);
    const chunks = await collect(await client.completions.create({ model, prompt: PROMPT, ...greedy, stop, stream: true }));
    const streamed = splitCompletionStream(chunks);
    assert.deepEqual(streamed.texts, [before], "no part of the stop string is streamed");
    assert.deepEqual(streamed.finishReasons, ["stop"]);
  }],

  ["chat stop string: cut before it, finish_reason stop", async () => {
    const { stop, before } = pickStopString(expectedChat);
    const response = await client.chat.completions.create({ model, messages: chatMessages, ...greedy, ...noThinking, stop });
    assert.equal(response.choices[0].message.content, before);
    assert.equal(response.choices[0].finish_reason, "stop");
    const chunks = await collect(await client.chat.completions.create({
      model, messages: chatMessages, ...greedy, ...noThinking, stop, stream: true }));
    const streamed = splitChatStream(chunks);
    assert.deepEqual(streamed.contents, [before]);
    assert.deepEqual(streamed.finishReasons, ["stop"]);
  }],

  ["n=2 (greedy): two identical choices, usage counts the prompt once", async () => {
    const single = await client.completions.create({ model, prompt: PROMPT, ...greedy });
    const response = await client.completions.create({ model, prompt: PROMPT, ...greedy, n: 2 });
    assert.deepEqual(response.choices.map((choice) => [choice.index, choice.text, choice.finish_reason]),
                     [[0, expected, "length"], [1, expected, "length"]]);
    checkUsage(response.usage, single.usage.prompt_tokens, 2 * MAX_TOKENS);
    const chunks = await collect(await client.completions.create({
      model, prompt: PROMPT, ...greedy, n: 2, stream: true, stream_options: { include_usage: true } }));
    const streamed = splitCompletionStream(chunks);
    assert.deepEqual(streamed.texts, [expected, expected]);
    assert.deepEqual(streamed.finishReasons, ["length", "length"]);
    assert.deepEqual(usageCounts(streamed.usage, MAX_TOKENS), usageCounts(response.usage, MAX_TOKENS));
  }],

  ["n=2 chat (greedy): two identical choices", async () => {
    const response = await client.chat.completions.create({ model, messages: chatMessages, ...greedy, ...noThinking, n: 2 });
    assert.deepEqual(response.choices.map((choice) => [choice.index, choice.message.content]),
                     [[0, expectedChat], [1, expectedChat]]);
    assert.equal(response.usage.completion_tokens, 2 * MAX_TOKENS);
  }],

  ["echo: the prompt comes first, streaming or not", async () => {
    const response = await client.completions.create({ model, prompt: PROMPT, ...greedy, echo: true });
    assert.equal(response.choices[0].text, PROMPT + expected);
    checkUsage(response.usage, undefined, MAX_TOKENS);
    const chunks = await collect(await client.completions.create({ model, prompt: PROMPT, ...greedy, echo: true, stream: true }));
    assert.deepEqual(splitCompletionStream(chunks).texts, [PROMPT + expected]);
  }],

  ["completion logprobs: one entry per token, the tokens spell the text, greedy picks the top", async () => {
    const response = await client.completions.create({ model, prompt: PROMPT, ...greedy, logprobs: 2 });
    const choice = response.choices[0];
    assert.equal(choice.text, expected, "asking for logprobs changes no text");
    checkCompletionLogprobs(choice.logprobs, choice.text, response.usage.completion_tokens, 2);
    const chunks = await collect(await client.completions.create({
      model, prompt: PROMPT, ...greedy, logprobs: 2, stream: true }));
    const streamed = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
    for (const chunk of chunks) {
      for (const part of chunk.choices) {
        if (!part.logprobs) continue;
        for (const key of Object.keys(streamed)) streamed[key].push(...part.logprobs[key]);
      }
    }
    assert.deepEqual(streamed, choice.logprobs, "streamed logprobs equal the unstreamed ones");
    await expectApiError(() => client.completions.create({ model, prompt: PROMPT, ...greedy, logprobs: 21 }),
                         400, { param: "logprobs" });
    // The engine computes no prompt logprobs, which echo with logprobs would need.
    await expectApiError(() => client.completions.create({ model, prompt: PROMPT, ...greedy, logprobs: 1, echo: true }),
                         400, { param: "echo" });
  }],

  ["chat logprobs: bytes spell the content, top_logprobs sorted, greedy picks the top", async () => {
    const request = { model, messages: chatMessages, ...greedy, ...noThinking, logprobs: true, top_logprobs: 2 };
    const response = await client.chat.completions.create(request);
    const choice = response.choices[0];
    assert.equal(choice.message.content, expectedChat);
    checkChatLogprobs(choice.logprobs.content, choice.message.content, response.usage.completion_tokens, 2);
    const chunks = await collect(await client.chat.completions.create({ ...request, stream: true }));
    const streamed = chunks.flatMap((chunk) => chunk.choices.flatMap((part) => part.logprobs?.content ?? []));
    assert.deepEqual(streamed, choice.logprobs.content, "streamed logprobs equal the unstreamed ones");
    const without = await client.chat.completions.create({ model, messages: chatMessages, ...greedy, ...noThinking });
    assert.equal(without.choices[0].logprobs ?? null, null, "no logprobs unless asked");
    await expectApiError(() => client.chat.completions.create({ model, messages: chatMessages, top_logprobs: 2 }),
                         400, { param: "top_logprobs" });
  }],

  ["errors surface as openai.APIError with the server's status and body", async () => {
    const missing = await expectApiError(
      () => client.completions.create({ ...greedy, model: "no-such-model", prompt: PROMPT }),
      404, { code: "model_not_found", param: "model", type: "invalid_request_error" });
    assert.ok(missing instanceof openai.NotFoundError);
    await expectApiError(
      () => client.chat.completions.create({ ...greedy, model: "no-such-model", messages: chatMessages, stream: true }),
      404, { code: "model_not_found" });
    const badType = await expectApiError(
      () => client.completions.create({ model, prompt: PROMPT, max_tokens: "many" }),
      400, { param: "max_tokens", type: "invalid_request_error" });
    assert.ok(badType instanceof openai.BadRequestError);
    await expectApiError(() => client.completions.create({ model, prompt: PROMPT, temperature: -1 }),
                         400, { param: "temperature" });
    await expectApiError(() => client.completions.create({ model, prompt: PROMPT, not_an_openai_field: 1 }),
                         400, { param: "not_an_openai_field" });
    await expectApiError(() => client.completions.create({ model, prompt: PROMPT, max_tokens: 1 << 20 }),
                         400, { param: "max_tokens", code: "context_length_exceeded" });
    await expectApiError(() => client.chat.completions.create({ model, messages: [] }), 400, { type: "invalid_request_error" });
  }],

  ["SIGTERM with a stream in flight: the stream ends and the server exits 0", async () => {
    const stream = await client.completions.create({
      model, prompt: PROMPT, max_tokens: 20000, temperature: 0, ignore_eos: true, stream: true });
    const iterator = stream[Symbol.asyncIterator]();
    await withTimeout(iterator.next(), 30, "first chunk");
    const exitCode = await server.stop();
    assert.equal(exitCode, 0, `exit code; stderr:\n${server.stderr()}`);
    // The client sees either the end of the stream or a connection error, never a hang.
    await withTimeout((async () => {
      try {
        while (!(await iterator.next()).done) { /* drain */ }
      } catch (error) {
        assert.ok(error instanceof openai.OpenAIError || error instanceof Error);
      }
    })(), 15, "the interrupted stream to end");
  }],
]);

await server.stop();
if (failed > 0) {
  console.log(`${failed} check(s) failed; server stderr:\n${server.stderr()}`);
  process.exit(1);
}
console.log("all openai client checks passed");
