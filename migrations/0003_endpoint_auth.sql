-- A subscription's own request headers and how it authenticates to its endpoint (basic auth,
-- OAuth2 client credentials, a TLS client certificate), and the public key of a v1a signing key.
--
-- What is not secret is kept in `request` (JSON, as the API shows it). Each secret among it is a
-- row of subscription_secrets with its purpose (a reference, or sealed like a signing secret and
-- bound to its subscription), so `store reseal` and key rotation cover it too.

ALTER TABLE subscriptions ADD COLUMN request jsonb NOT NULL DEFAULT '{}';

-- 'signing', 'header:<lower-case name>', 'basic_auth.password', 'oauth2.client_secret',
-- 'tls.cert', 'tls.key' or 'tls.ca'.
ALTER TABLE subscription_secrets ADD COLUMN purpose text NOT NULL DEFAULT 'signing';

-- whpk_...: the public half of a sealed whsk_ signing key, shown by the API; NULL otherwise.
ALTER TABLE subscription_secrets ADD COLUMN public_key text;

CREATE INDEX subscription_secrets_by_purpose ON subscription_secrets (subscription_id, purpose);
