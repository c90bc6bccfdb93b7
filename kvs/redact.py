"""``redact_url``: secrets masked out of URLs before they reach a message or a log.

One function for every package (the KVS client's errors, Kubernetes' config checks and
deploy errors): a URL's password is a secret wherever it is quoted.

    >>> redact_url("redis://:s3cret@kvs:6379/0")
    'redis://:***@kvs:6379/0'
    >>> redact_url("redis://app:s3cret@[::1]:6379/0?password=s3cret&db=1")
    'redis://app:***@[::1]:6379/0?password=***&db=1'
    >>> redact_url("connecting to redis://:s3cret@kvs:6379 failed")
    'connecting to redis://:***@kvs:6379 failed'
    >>> redact_url("redis+sentinel://:s3cret@s1:26379,s2:26379/main?sentinel_password=x")
    'redis+sentinel://:***@s1:26379,s2:26379/main?sentinel_password=***'
"""

from __future__ import annotations

import re

# ``//user:password@host``: the user part has no ':'; the password runs to the *last* '@'
# before the path, query or fragment (as urllib splits a netloc), so a password that
# holds an unescaped '@' is masked whole. No parsing: a URL urllib refuses (a bad port,
# a broken IPv6 literal) and a URL inside a longer message are masked the same way.
_USERINFO_PASSWORD = re.compile(r"(//[^/?#:\s]*:)[^/?#\s]*@")
# ``?password=...`` (redis-py reads the password from the query string too) and
# ``?sentinel_password=...`` (a Sentinel store URL's, kvs/urls.py)
_QUERY_PASSWORD = re.compile(r"([?&](?:sentinel_)?password=)[^&#\s]*", re.IGNORECASE)


def redact_url(text: str) -> str:
    """``text`` with every URL password in it replaced by ``***``: in the userinfo
    (``scheme://user:***@host``) and in a ``password=`` query parameter. The rest (user,
    host as written, port, path) stays, so the message still says where it went.
    ``text`` may be one URL or a message quoting URLs; anything not a str is shown by
    its ``repr`` (redacted as well)."""
    if not isinstance(text, str):
        text = repr(text)
    text = _USERINFO_PASSWORD.sub(r"\1***@", text)
    return _QUERY_PASSWORD.sub(r"\1***", text)
