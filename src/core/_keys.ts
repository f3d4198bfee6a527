/**
 * Where a prefix's keys live. Two layouts, chosen once per prefix (keys of one are invisible to
 * the other, so switching a prefix while locks are held lets two holders in):
 *
 * - single (the default): `<prefix>:lock:{<name>}…` for a name's keys, and one stats hash, held
 *   index and audit stream per prefix (`<prefix>:stats`, `:held`, `:held:ends`, `:audit`). Right
 *   for one Redis, Upstash included; on a Redis Cluster only with stats off.
 * - cluster: every key starts `<prefix>:{<bucket>}`, the bucket (0–63) a hash of the name's slot
 *   tag (see `slotTag`), and each bucket has its own stats hash, held index and audit stream, so
 *   every script's keys share one slot while names spread over 64 slots. Names that share a slot
 *   tag share a bucket, so multi-name locks still work. Stats, lists and audits read all 64
 *   buckets in one pipeline.
 *
 * @module
 */

import { slotTag } from "./_validate.ts";
import { InvalidType } from "./_invalid.ts";

/** The buckets of the cluster layout. Fixed: a key's bucket must never change. */
export const BUCKETS = 64;

/** The bucket of a name: FNV-1a over its slot tag, mod {@linkcode BUCKETS}. */
export function bucketOf(name: string): number {
  let hash = 0x811c9dc5;
  for (const char of slotTag(name)) hash = Math.imul(hash ^ char.charCodeAt(0), 0x01000193);
  return (hash >>> 0) % BUCKETS;
}

/** A prefix's key space in one layout, with or without the stats the scripts keep. */
export class KeySpace {
  readonly prefix: string;
  readonly stats: boolean;
  readonly cluster: boolean;

  constructor(prefix: string, stats: unknown = true, cluster: unknown = false) {
    if (typeof stats !== "boolean") throw new InvalidType("stats must be true or false");
    if (typeof cluster !== "boolean") throw new InvalidType("cluster must be true or false");
    this.prefix = prefix;
    this.stats = stats;
    this.cluster = cluster;
  }

  /** How every key of `name` (a lock name, record id or job name) starts. */
  base(name: string): string {
    return this.cluster ? `${this.prefix}:{${bucketOf(name)}}` : this.prefix;
  }

  /** Every bucket's start: the prefix alone, or the 64 of the cluster layout. */
  bases(): string[] {
    if (!this.cluster) return [this.prefix];
    return Array.from({ length: BUCKETS }, (_, i) => `${this.prefix}:{${i}}`);
  }

  /** The stats hash that counts for `name`, as a one-key list; none with stats off. */
  statsHash(name: string): string[] {
    return this.stats ? [`${this.base(name)}:stats`] : [];
  }

  /** The stats hash and the held index (names, lease ends) of `name`'s bucket; none when off. */
  statsKeys(name: string): StatsKeys {
    if (!this.stats) return {};
    const base = this.base(name);
    return { statsKey: `${base}:stats`, namesKey: `${base}:held`, endsKey: `${base}:held:ends` };
  }

  /**
   * A lock's keys. The name sits in a hash tag so all of them share a cluster slot (see
   * slotTag): the record, the queue, its tickets and offers, the shared holders, the release
   * marks, the breaks by id and the readers' bell.
   */
  lock(name: string): LockKeys {
    const base = `${this.base(name)}:lock:{${name}}`;
    return {
      lockKey: base,
      queueKey: `${base}:queue`,
      ticketsKey: `${base}:tickets`,
      offersKey: `${base}:offers`,
      holdersKey: `${base}:holders`,
      marksKey: `${base}:released`,
      breaksKey: `${base}:breaks`,
      readersKey: `${base}:readers`,
    };
  }

  /** A blocked waiter's wake key on `name`, by its wake id ('' for none: a key never written). */
  wake(name: string, wakeId: string): string {
    return `${this.lock(name).lockKey}:wake:${wakeId}`;
  }

  /** The audit stream of `name`'s bucket. */
  audit(name: string): string {
    return `${this.base(name)}:audit`;
  }
}

/** The keys of one lock name. */
export interface LockKeys {
  lockKey: string;
  queueKey: string;
  ticketsKey: string;
  offersKey: string;
  holdersKey: string;
  marksKey: string;
  /** Breaks with an id, a hash by id: the fence each broke (0: none), for their retries. */
  breaksKey: string;
  /** A stream that rings (XADD) when the name fits the shared waiters at the queue's head. */
  readersKey: string;
}

/** The stats keys of a bucket, all or none (stats off). */
export interface StatsKeys {
  statsKey?: string;
  namesKey?: string;
  endsKey?: string;
}
