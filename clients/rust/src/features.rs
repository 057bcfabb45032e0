//! What the connected server's pgque offers, read once per worker or
//! consumer run from pg_proc, so the client works with servers with and
//! without the functions of later versions (outputs, progress, flows,
//! job_channel, the waiting receive).

use tokio_postgres::Client;

use crate::error::Result;

/// Server capabilities.
#[derive(Debug, Clone, Copy, Default)]
pub struct Features {
    /// `complete_many(ids, tokens, outputs)`.
    pub outputs: bool,
    /// `set_progress`.
    pub progress: bool,
    /// `enqueue_flow`.
    pub flows: bool,
    /// `job_channel(queue)`.
    pub job_channel: bool,
    /// Job headers (trace context): `enqueue(..., headers)`, and dispatch
    /// returns them.
    pub headers: bool,
    /// The waiting `receive(queue, consumer, max_return, wait interval)`,
    /// which sleeps in the server until the consumer has a batch (pgque 0.9,
    /// docs/waits.md).
    pub receive_wait: bool,
    /// Its `receive_with_headers(queue, consumer, max_return, wait interval)` twin.
    pub receive_with_headers_wait: bool,
}

impl Features {
    /// Reads them (one catalogue query).
    pub async fn read(client: &Client) -> Result<Features> {
        let rows = client
            .query(
                "SELECT p.proname::text, p.pronargs::int4, \
                        p.pronargs = 4 AND p.proargtypes[3] = 'pg_catalog.interval'::pg_catalog.regtype \
                 FROM pg_catalog.pg_proc p \
                 JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
                 WHERE n.nspname = 'pgque' \
                   AND p.proname = ANY ('{complete_many,set_progress,enqueue_flow,job_channel,enqueue,\
                                          receive,receive_with_headers}')",
                &[],
            )
            .await?;
        let mut f = Features::default();
        for r in rows {
            let name: String = r.get(0);
            let nargs: i32 = r.get(1);
            let waits: bool = r.get(2);
            match name.as_str() {
                "complete_many" if nargs >= 3 => f.outputs = true,
                "set_progress" => f.progress = true,
                "enqueue_flow" => f.flows = true,
                "job_channel" => f.job_channel = true,
                "enqueue" if nargs >= 13 => f.headers = true,
                "receive" if waits => f.receive_wait = true,
                "receive_with_headers" if waits => f.receive_with_headers_wait = true,
                _ => {}
            }
        }
        Ok(f)
    }
}
