-- A renewal secret's one retry (RenewParams.Grace), and invitations that
-- replace a device or die with the admin who made them.
ALTER TABLE renewal_secrets ADD COLUMN retried_at timestamptz; -- NULL: never retried
ALTER TABLE invitations ADD COLUMN replaces boolean NOT NULL DEFAULT false;
ALTER TABLE invitations ADD COLUMN created_by text COLLATE "C"; -- the admin device, or NULL
CREATE INDEX invitations_created_by ON invitations (household, created_by);
