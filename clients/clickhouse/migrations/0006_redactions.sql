-- Secrets redacted before publishing (issue #18): how many placeholders `[REDACTED:<detector>]` the
-- producer put into a step's text fields. 0 for steps recorded before redaction existed.

ALTER TABLE agentstream.steps
    ADD COLUMN IF NOT EXISTS redactions UInt32 DEFAULT 0;
