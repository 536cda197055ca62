-- A policy of your own: train on the images your own model scored as meaningful to your sites.
--
-- training_set's config names this file (policy_sql) and your table of scores (tables: {site_scores: ...}), a
-- Parquet file with one row per image: key, score. docs/selection.md is the contract this file keeps.

-- One row per accepted image: no rule means selected.
CREATE TABLE decisions AS
SELECT
    accepted.source,
    accepted.key,
    accepted.split,
    CASE
        WHEN accepted.annotation NOT IN ('annotated', 'unlisted_negative') THEN 'not_annotated'
        WHEN coalesce(site_scores.score, 0) < 0.5 THEN 'site_score'
    END AS rule,
    CASE
        WHEN accepted.annotation NOT IN ('annotated', 'unlisted_negative') THEN 'no labels to train on'
        WHEN coalesce(site_scores.score, 0) < 0.5
            THEN 'scored ' || coalesce(site_scores.score, 0) || ' for our sites, under 0.5'
    END AS reason,
    NULL::VARCHAR AS copy_of
FROM accepted LEFT JOIN site_scores USING (key);

-- The selected images as packing reads them: every column of `accepted` but the annotation state and hashes.
CREATE VIEW selected AS
SELECT accepted.* EXCLUDE (annotation, phash, dhash)
FROM accepted SEMI JOIN (SELECT source, key FROM decisions WHERE rule IS NULL) AS chosen USING (source, key);

-- This policy looks for no near-duplicates: it leaves the table empty.
CREATE TABLE near_duplicates AS
SELECT source AS cluster, source, key, "group", split AS validated_split, split AS outcome, NULL::VARCHAR AS copy_of
FROM accepted
WHERE false;
