-- A renewal secret's one retry (RenewParams.Grace), and invitations that
-- replace a device or die with the admin who made them.
ALTER TABLE renewal_secrets ADD COLUMN retried_at INTEGER; -- NULL: never retried
ALTER TABLE invitations ADD COLUMN replaces INTEGER NOT NULL DEFAULT 0;
ALTER TABLE invitations ADD COLUMN created_by TEXT; -- the admin device, or NULL
CREATE INDEX invitations_created_by ON invitations (household, created_by);
