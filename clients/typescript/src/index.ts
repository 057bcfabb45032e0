/**
 * pgque-client: producers, a job worker and event consumers for the pgque
 * PostgreSQL extension, on node-postgres (`pg`).
 *
 * Producers run on your client and in your transaction:
 *
 * ```ts
 * import pg from "pg";
 * import { enqueue, send } from "pgque-client";
 * const client = new pg.Client("postgres:///app");
 * await client.connect();
 * await client.query("BEGIN");
 * await enqueue(client, "emails", "welcome", { to: 1 }, { priority: 5 });
 * await send(client, "orders", { id: 7 }, { type: "order.created", partitionKey: "tenant-42" });
 * await client.query("COMMIT");
 * ```
 *
 * {@link Worker}, {@link Consumer} and {@link PartitionedConsumer} own their
 * connections and run until stop(), an AbortSignal or SIGTERM / SIGINT.
 */
export {
  DuplicateJob,
  FeatureNotSupported,
  InvalidJson,
  InvalidName,
  InvalidParameterValue,
  NameTooLong,
  NullValueNotAllowed,
  NumericValueOutOfRange,
  PgqueError,
  ServerFeatureMissing,
  SlotLost,
  UndefinedObject,
  WrongState,
  translateError,
} from "./errors.js";
export { features, type Features } from "./features.js";
export {
  enqueue,
  enqueueFlow,
  enqueueMany,
  send,
  sendAt,
  sendBatch,
  sendIdem,
  type EnqueueOptions,
  type Enqueued,
  type FlowJob,
  type FlowJobSpec,
  type IdemSend,
  type NewJob,
  type SendBatchOptions,
  type SendOptions,
} from "./producer.js";
export { Job, Worker, type JobHandler, type TxJobHandler, type WorkerOptions } from "./worker.js";
export {
  Consumer,
  Message,
  PartitionedConsumer,
  type ConsumerOptions,
  type ConsumerOptionsBase,
  type MessageHandler,
  type PartitionedConsumerOptions,
  type TxMessageHandler,
} from "./consumer.js";
export type { ConnectionOptions, Logger, Queryable } from "./util.js";
