"""Guards the S3 test server the tiering tests rely on (SeaweedFS `weed mini`, no silt):
SigV4 enforced, conditional writes, ranged reads, listing, and a restart on the same folder."""

import json
import os

import boto3
import botocore.exceptions
import pytest
from botocore.config import Config

pytest_plugins = ["tiering_harness"]  # the `seaweedfs` fixture


def error_code(excinfo):
    e = excinfo.value
    return e.response["Error"]["Code"], e.response["ResponseMetadata"]["HTTPStatusCode"]


def test_put_get_conditional_and_restart(seaweedfs):
    s3 = seaweedfs
    c = s3.client()
    body = os.urandom(300_000)
    put = c.put_object(Bucket=s3.bucket, Key="h/seg/0001", Body=body)
    assert put["ETag"].strip('"')
    assert c.get_object(Bucket=s3.bucket, Key="h/seg/0001")["Body"].read() == body
    ranged = c.get_object(Bucket=s3.bucket, Key="h/seg/0001", Range="bytes=1000-1999")
    assert ranged["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert ranged["Body"].read() == body[1000:2000]

    # Create-only write: the second one must be refused with 412.
    manifest = {"format": 1, "epoch": 1, "writer": "a", "objects": []}
    c.put_object(Bucket=s3.bucket, Key="h/manifest.json", Body=json.dumps(manifest).encode(), IfNoneMatch="*")
    with pytest.raises(botocore.exceptions.ClientError) as e:
        c.put_object(Bucket=s3.bucket, Key="h/manifest.json", Body=b"{}", IfNoneMatch="*")
    assert error_code(e) == ("PreconditionFailed", 412)
    assert s3.get_json("h/manifest.json") == manifest

    # Compare-and-swap on the ETag: the current one wins once, a stale one is refused.
    etag = c.head_object(Bucket=s3.bucket, Key="h/manifest.json")["ETag"]
    manifest["epoch"] = 2
    c.put_object(Bucket=s3.bucket, Key="h/manifest.json", Body=json.dumps(manifest).encode(), IfMatch=etag)
    with pytest.raises(botocore.exceptions.ClientError) as e:
        c.put_object(Bucket=s3.bucket, Key="h/manifest.json", Body=b"{}", IfMatch=etag)
    assert error_code(e) == ("PreconditionFailed", 412)
    assert s3.get_json("h/manifest.json")["epoch"] == 2
    assert s3.get_json("h/missing.json", default=None) is None
    assert s3.list("h/") == {"h/seg/0001": len(body), "h/manifest.json": len(json.dumps(manifest))}

    # SigV4 is enforced: a wrong secret and an unsigned request are refused.
    for cfg, secret in ((Config(s3={"addressing_style": "path"}), "wrong-secret"),
                        (Config(s3={"addressing_style": "path"}, signature_version=botocore.UNSIGNED), "x")):
        other = boto3.session.Session().client(
            "s3", endpoint_url=s3.endpoint, region_name="us-east-1",
            aws_access_key_id=s3.access_key, aws_secret_access_key=secret, config=cfg)
        with pytest.raises(botocore.exceptions.ClientError) as e:
            other.get_object(Bucket=s3.bucket, Key="h/seg/0001")
        assert error_code(e)[1] == 403

    # Multipart (large segments may be uploaded this way); the ETag is the S3 "md5-of-md5s-N" form.
    parts = [os.urandom(5 << 20), os.urandom(1000)]
    mp = c.create_multipart_upload(Bucket=s3.bucket, Key="h/seg/0002")
    done = [{"PartNumber": i + 1, "ETag": c.upload_part(Bucket=s3.bucket, Key="h/seg/0002", UploadId=mp["UploadId"],
                                                        PartNumber=i + 1, Body=p)["ETag"]}
            for i, p in enumerate(parts)]
    fin = c.complete_multipart_upload(Bucket=s3.bucket, Key="h/seg/0002", UploadId=mp["UploadId"],
                                      MultipartUpload={"Parts": done})
    assert fin["ETag"].strip('"').endswith("-2")
    assert s3.get_bytes("h/seg/0002") == b"".join(parts)
    c.delete_object(Bucket=s3.bucket, Key="h/seg/0002")

    env = s3.env()
    assert env["AWS_ENDPOINT_URL"] == s3.endpoint and env["AWS_ALLOW_HTTP"] == "true"

    # Down: requests fail. Up again on the same folder and ports: the objects are back.
    s3.stop()
    assert not s3.running
    with pytest.raises((botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectionError)):
        s3._new_client(retries=1).head_bucket(Bucket=s3.bucket)
    s3.start()
    assert s3.get_bytes("h/seg/0001") == body
    assert s3.get_json("h/manifest.json")["epoch"] == 2
    with pytest.raises(botocore.exceptions.ClientError) as e:
        c.put_object(Bucket=s3.bucket, Key="h/manifest.json", Body=b"{}", IfNoneMatch="*")
    assert error_code(e) == ("PreconditionFailed", 412)
