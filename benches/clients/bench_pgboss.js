// One cell of the client benchmark for pg-boss (npm): drain a backlog of N
// trivial jobs with one worker (batchSize 50), as bench_py.py does.
//   node bench_pgboss.js SOCKETDIR PORT DB N [LOOPS]
// LOOPS work() loops (default 1), each fetching batches of 50 every poll
// (pg-boss 10 polls at most every 0.5 s and has no in-process concurrency knob).
const PgBoss = require('pg-boss');

async function main() {
  const [host, port, database, nStr, loopsStr] = process.argv.slice(2);
  const loops = parseInt(loopsStr || '1', 10);
  const n = parseInt(nStr, 10);
  const boss = new PgBoss({ host, port: parseInt(port, 10), database, user: 'postgres', max: 4 + loops });
  boss.on('error', (e) => console.error(e));
  await boss.start();
  await boss.deleteQueue('bench').catch(() => {});
  await boss.createQueue('bench');
  for (let i = 0; i < n; i += 1000) {
    const jobs = [];
    for (let j = i; j < Math.min(n, i + 1000); j++) jobs.push({ name: 'bench', data: { i: j } });
    await boss.insert(jobs);
  }
  let done = 0;
  const t0 = process.hrtime.bigint();
  await new Promise((resolve) => {
    for (let l = 0; l < loops; l++) {
      boss.work('bench', { batchSize: 50, pollingIntervalSeconds: 0.5 }, async (jobs) => {
        done += jobs.length;
        if (done >= n) setImmediate(resolve);
      });
    }
  });
  // The last batch is completed after the handler returns: wait for it.
  for (;;) {
    const left = await boss.getQueueSize('bench', { before: 'completed' });
    if (left === 0) break;
    await new Promise((r) => setTimeout(r, 5));
  }
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  await boss.stop({ graceful: false, wait: false });
  console.log(JSON.stringify({ system: `pg-boss (Node, ${loops} work loop${loops > 1 ? 's' : ''})`, jobs: n, secs: +secs.toFixed(3), jobs_per_s: Math.round(n / secs) }));
  process.exit(0);
}
main().catch((e) => { console.error(e); process.exit(1); });
