//! A subscription's own request: its headers and how it authenticates to its endpoint (basic
//! auth, OAuth2, a client certificate), checked; the secrets among them set apart for sealing.

use std::collections::BTreeMap;

use crate::api::model::{BasicAuthInput, HeaderInput, OAuth2Input, TlsInput};
use crate::store::request::{
    self as stored, StoredBasicAuth, StoredHeader, StoredOAuth2, StoredRequest, StoredTls,
};
use crate::subscriptions::auth::{check_username, conflicts};
use crate::subscriptions::headers::{check_header_name, check_header_value};
use crate::subscriptions::parse::{TOKEN_URL_CREDENTIALS_INSTEAD, refuse_credentials};
use crate::subscriptions::{OAuth2, SecretRef};

use super::{Plain, Problems};

/// The largest secret or PEM a request may give.
pub const MAX_SECRET_LEN: usize = 16 * 1024;

fn secret_text(field: &str, value: &str, problems: &mut Problems) -> bool {
    if value.is_empty() {
        problems.add(field, "is empty");
        false
    } else if value.len() > MAX_SECRET_LEN {
        problems.add(field, format!("longer than {MAX_SECRET_LEN} bytes"));
        false
    } else {
        true
    }
}

/// Headers: the stored settings, and the secret values by purpose.
pub(super) fn headers(
    raw: &BTreeMap<String, HeaderInput>,
    problems: &mut Problems,
    out: &mut (StoredRequest, Vec<(String, Plain)>),
) {
    for (name, value) in raw {
        let field = format!("headers.{name}");
        let lower = match check_header_name(name) {
            Ok(lower) => lower,
            Err(why) => {
                problems.add(&field, why.to_string());
                continue;
            }
        };
        if out.0.headers.contains_key(&lower) {
            problems.add(&field, "given twice (names are case-insensitive)");
            continue;
        }
        let header = match value {
            HeaderInput::Value(v) => {
                if let Err(why) = check_header_value(name, v) {
                    problems.add(&field, why.to_string());
                    continue;
                }
                StoredHeader {
                    value: Some(v.clone()),
                    secret: false,
                }
            }
            HeaderInput::Secret(s) => {
                if !secret_text(&format!("{field}.secret"), &s.secret, problems) {
                    continue;
                }
                if check_header_value(name, &s.secret).is_err() {
                    problems.add(
                        &format!("{field}.secret"),
                        "not a header value (visible ASCII and spaces)",
                    );
                    continue;
                }
                out.1
                    .push((stored::header_purpose(&lower), Plain(s.secret.clone())));
                StoredHeader {
                    value: None,
                    secret: true,
                }
            }
        };
        out.0.headers.insert(lower, header);
    }
}

pub(super) fn basic_auth(
    raw: &BasicAuthInput,
    problems: &mut Problems,
    out: &mut (StoredRequest, Vec<(String, Plain)>),
) {
    let mut ok = true;
    if let Err(why) = check_username(&raw.username) {
        problems.add("basic_auth.username", why.to_string());
        ok = false;
    }
    ok &= secret_text("basic_auth.password", &raw.password, problems);
    if ok {
        out.0.basic_auth = Some(StoredBasicAuth {
            username: raw.username.clone(),
        });
        out.1
            .push((stored::BASIC_PASSWORD.into(), Plain(raw.password.clone())));
    }
}

pub(super) fn oauth2(
    raw: &OAuth2Input,
    problems: &mut Problems,
    out: &mut (StoredRequest, Vec<(String, Plain)>),
) -> Option<reqwest::Url> {
    // The reference is a placeholder: the secret is sealed once the subscription's id is known.
    let built = OAuth2::build(
        &raw.token_url,
        &raw.client_id,
        SecretRef::Env(String::new()),
        raw.scope.as_deref(),
        raw.audience.as_deref(),
        raw.auth_method.as_deref(),
    );
    let ok = secret_text("oauth2.client_secret", &raw.client_secret, problems);
    let built = built.and_then(|o| {
        refuse_credentials(&o.token_url, TOKEN_URL_CREDENTIALS_INSTEAD)
            .map(|()| o)
            .map_err(|why| ("token_url", why.to_string()))
    });
    match built {
        Err((field, why)) => {
            problems.add(&format!("oauth2.{field}"), why);
            None
        }
        Ok(_) if !ok => None,
        Ok(o) => {
            out.0.oauth2 = Some(StoredOAuth2 {
                token_url: o.token_url.to_string(),
                client_id: o.client_id.clone(),
                scope: o.scope.clone(),
                audience: o.audience.clone(),
                auth_method: o.method.as_str().into(),
            });
            out.1.push((
                stored::OAUTH2_CLIENT_SECRET.into(),
                Plain(raw.client_secret.clone()),
            ));
            Some(o.token_url)
        }
    }
}

pub(super) fn tls(
    raw: &TlsInput,
    problems: &mut Problems,
    out: &mut (StoredRequest, Vec<(String, Plain)>),
) {
    let mut ok = secret_text("tls.cert", &raw.cert, problems);
    ok &= secret_text("tls.key", &raw.key, problems);
    if ok && reqwest::Identity::from_pem(format!("{}\n{}\n", raw.cert, raw.key).as_bytes()).is_err()
    {
        problems.add(
            "tls.key",
            "cert and key are not a PEM certificate chain and private key (PKCS#8, PKCS#1 or SEC1)",
        );
        ok = false;
    }
    if let Some(ca) = &raw.ca
        && (!secret_text("tls.ca", ca, problems)
            || reqwest::Certificate::from_pem_bundle(ca.as_bytes()).map_or(true, |c| c.is_empty()))
    {
        problems.add("tls.ca", "not a PEM certificate");
        ok = false;
    }
    if ok {
        out.0.tls = Some(StoredTls {
            ca: raw.ca.is_some(),
        });
        out.1
            .push((stored::TLS_CERT.into(), Plain(raw.cert.clone())));
        out.1.push((stored::TLS_KEY.into(), Plain(raw.key.clone())));
        if let Some(ca) = &raw.ca {
            out.1.push((stored::TLS_CA.into(), Plain(ca.clone())));
        }
    }
}

/// The conflicts of a subscription's headers and authentication with each other and its URL.
pub(super) fn request_conflicts(
    url: &reqwest::Url,
    request: &StoredRequest,
    problems: &mut Problems,
) {
    for (field, why) in conflicts(
        url,
        request.amqp.as_ref(),
        request.headers.contains_key("authorization"),
        request.basic_auth.is_some(),
        request.oauth2.is_some(),
        request.tls.is_some(),
    ) {
        problems.add(field, why);
    }
}
