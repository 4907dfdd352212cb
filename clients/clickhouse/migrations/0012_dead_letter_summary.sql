-- Bounded dead letters (issue #34, schema 1.3): a dead letter of input over 64,000 bytes carries a
-- prefix of it, with the whole input's size and SHA-256, so that it always fits in one broker
-- message. Dead letters written before keep NULL / 0 here: their payload is the whole input.

ALTER TABLE agentstream.dead_letters
    ADD COLUMN IF NOT EXISTS payload_bytes Nullable(UInt64),
    ADD COLUMN IF NOT EXISTS payload_sha256 Nullable(String),
    ADD COLUMN IF NOT EXISTS payload_truncated UInt8 DEFAULT 0;
