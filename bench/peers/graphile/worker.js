// bench.peers: a Graphile Worker that POSTs each job's payload to the benchmark's sink, as a
// user's task would. Started by bench/peers/graphile.py, whose caller adds the jobs (graphile_worker.add_jobs).
//
//   DATABASE_URL=... SINK_URL=http://127.0.0.1:PORT CONCURRENCY=64 [MAX_POOL_SIZE=64] \
//     [BATCHING=1] node worker.js
//
// BATCHING=1 turns on what Graphile Worker's performance page configures (off by default): a
// local queue of concurrency + 1 jobs fetched at once, and completions and failures batched.
// Everything else is Graphile Worker's default (no local queue, no batched completion, poll
// interval 2 s: new jobs are picked up on their NOTIFY; a log line for each job completed).
// Prints "bench-peers: ready" once it is listening; stops (draining what it holds) on SIGTERM.
"use strict";
const http = require("node:http");
const { run } = require("graphile-worker");

const sink = process.env.SINK_URL;
const concurrency = Number(process.env.CONCURRENCY);
const maxPoolSize = process.env.MAX_POOL_SIZE ? Number(process.env.MAX_POOL_SIZE) : undefined;
const batching = process.env.BATCHING === "1"
  ? { localQueue: { size: concurrency + 1 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 }
  : {};

// The HTTP client: node:http with one keep-alive agent, at most `concurrency` sockets (as the
// listener's aiohttp session). Not Node's fetch: on this machine it alone managed under 1,000
// requests/s at about 500 us of CPU each, and would have been measured instead of the queue.
const agent = new http.Agent({ keepAlive: true, maxSockets: concurrency });
const target = new URL(sink);

function post(path, requestId, body) {
  return new Promise((resolve, reject) => {
    const request = http.request({
      host: target.hostname, port: target.port, path, method: "POST", agent,
      headers: {
        "Content-Type": "application/json",
        "Content-Length": Buffer.byteLength(body),
        "X-Request-Id": requestId, // what the sink logs
      },
    }, (response) => {
      response.resume(); // read the body to its end, so the socket can be reused
      response.on("end", () => resolve(response.statusCode));
      response.on("error", reject);
    });
    request.on("error", reject);
    request.end(body);
  });
}

const taskList = {
  // The task: POST the job's payload to the sink.
  post: async (payload, helpers) => {
    const body = JSON.stringify({ args: payload, invoker: { kind: "job", id: helpers.job.id } });
    const status = await post(`/graphile/${payload.i}`, `g${payload.i}`, body);
    // A job whose request fails must fail too (and be retried), as the listener's run would.
    if (status < 200 || status >= 300) throw new Error(`sink answered ${status}`);
  },
};

async function main() {
  const runner = await run({
    connectionString: process.env.DATABASE_URL,
    concurrency,
    ...(maxPoolSize === undefined ? {} : { maxPoolSize }),
    preset: { worker: batching },
    noHandleSignals: true, // the SIGTERM handler below stops it
    taskList,
  });
  process.stdout.write("bench-peers: ready\n");
  process.on("SIGTERM", () => runner.stop());
  await runner.promise;
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
